"""`draftsmith tune`: fit a speculator to a user's own traffic and report what it buys."""

"""A second narrow workload for `draftsmith tune`: turn a free-text record into JSON.

Each request holds one short description of a person, a product or a trip, written in one of a few
styles, and asks for a JSON object with given keys. Names, places and numbers come from the lists
below with a fixed seed, so the file is the same on every machine; none of these requests is in the
data the shipped speculators were trained on.

    python examples/records-to-json/make_traffic.py --num 300 --out traffic.jsonl
"""

from __future__ import annotations

import random

from draftsmith.tune.split import traffic_main

FIRST = ["Maria", "James", "Aiko", "Lucas", "Fatima", "Oliver", "Ingrid", "Mateo", "Chen", "Amara", "Noah",
         "Sofia", "Ravi", "Elena", "Kwame", "Hannah", "Diego", "Yuki", "Omar", "Clara"]  # fmt: skip
LAST = ["Lopez", "Smith", "Tanaka", "Martin", "Khan", "Brown", "Larsen", "Garcia", "Wang", "Okafor", "Miller",
        "Rossi", "Patel", "Novak", "Mensah", "Weber", "Silva", "Sato", "Haddad", "Dubois"]  # fmt: skip
CITIES = ["Lisbon", "Toronto", "Osaka", "Lyon", "Karachi", "Leeds", "Bergen", "Seville", "Chengdu", "Lagos",
          "Denver", "Turin", "Pune", "Prague", "Accra", "Hamburg", "Recife", "Kyoto", "Beirut", "Nantes"]  # fmt: skip
JOBS = ["nurse", "teacher", "software engineer", "carpenter", "accountant", "chef", "pilot", "architect",
        "pharmacist", "electrician"]  # fmt: skip
PRODUCTS = [("desk lamp", "lighting"), ("coffee grinder", "kitchen"), ("rain jacket", "clothing"),
            ("bluetooth speaker", "audio"), ("yoga mat", "sports"), ("office chair", "furniture"),
            ("water bottle", "outdoor"), ("board game", "toys")]  # fmt: skip


def person(rng: random.Random) -> tuple[str, str]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    age, city, job = rng.randint(19, 78), rng.choice(CITIES), rng.choice(JOBS)
    email = f"{first.lower()}.{last.lower()}@example.com"
    text = rng.choice([
        f"{first} {last} is {age} years old, works as a {job} in {city} and can be reached at {email}.",
        f"Contact: {first} {last}, {job}, based in {city}. Age {age}. Email {email}.",
        f"Our new member {first} {last} ({age}) lives in {city}; occupation: {job}; mail: {email}",
    ])  # fmt: skip
    return text, "name, age, city, occupation, email"


def product(rng: random.Random) -> tuple[str, str]:
    name, cat = rng.choice(PRODUCTS)
    price, stock = round(rng.uniform(5, 400), 2), rng.randint(0, 500)
    sku = f"{cat[:3].upper()}-{rng.randint(1000, 9999)}"
    text = rng.choice([
        f"The {name} (SKU {sku}) in our {cat} range costs ${price} and we have {stock} in stock.",
        f"Item {sku}: {name}, category {cat}, price {price} USD, {stock} units available.",
        f"{stock} units of the {name} are left; it sells for ${price} under {cat}, code {sku}.",
    ])  # fmt: skip
    return text, "sku, product, category, price, stock"


def trip(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(CITIES, 2)
    day, month = rng.randint(1, 28), rng.choice(["March", "June", "September", "November"])
    n, traveler = rng.randint(1, 6), f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    text = rng.choice([
        f"{traveler} booked a trip from {a} to {b} on {month} {day} for {n} people.",
        f"Booking for {traveler}: {n} passengers, departing {a} on {day} {month}, arriving in {b}.",
    ])  # fmt: skip
    return text, "traveler, origin, destination, date, passengers"


def request(rng: random.Random) -> str:
    text, keys = rng.choice([person, product, trip])(rng)
    ask = rng.choice([
        "Convert this record into a JSON object with the keys {k}:\n\n{t}",
        "Extract the fields ({k}) from the text below and return them as JSON.\n\n{t}",
        "Return only a JSON object with keys {k} for this record: {t}",
    ])  # fmt: skip
    return ask.format(k=keys, t=text)


if __name__ == "__main__":
    traffic_main(__doc__.splitlines()[0], request, "rec")

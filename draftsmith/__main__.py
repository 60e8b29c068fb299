from draftsmith.cli import main

raise SystemExit(main())

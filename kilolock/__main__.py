from kilolock.cli import main

raise SystemExit(main())

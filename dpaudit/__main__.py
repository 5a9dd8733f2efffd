from dpaudit.cli import main

raise SystemExit(main())

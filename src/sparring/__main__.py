from sparring.cli import main

raise SystemExit(main())

from slurmtel.cli import main

raise SystemExit(main())

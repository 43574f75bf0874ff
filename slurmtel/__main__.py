from slurmtel.head import main

raise SystemExit(main())

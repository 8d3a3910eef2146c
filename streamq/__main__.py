from ._ops.cli import main

raise SystemExit(main())

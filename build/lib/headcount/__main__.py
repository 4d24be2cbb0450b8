# headcount.cli.entry imports nothing heavy before its Ctrl-C handler is in place
from headcount.cli.entry import main

raise SystemExit(main())

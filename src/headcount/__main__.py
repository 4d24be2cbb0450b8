# headcount.entry imports nothing heavy before its Ctrl-C handler is in place
from headcount.entry import main

raise SystemExit(main())

"""``python -m diloco_chaos.chaos.toxiproxy_server``: run the embedded server in the foreground."""

from diloco_chaos.chaos.toxiproxy_server import main

raise SystemExit(main())

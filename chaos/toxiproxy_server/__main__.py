"""``python -m chaos.toxiproxy_server``: run the embedded server in the foreground."""

from chaos.toxiproxy_server import main

raise SystemExit(main())

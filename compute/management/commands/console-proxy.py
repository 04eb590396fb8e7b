"""``manage.py console-proxy``: the websocket proxy to guests' interactive serial consoles
(``compute.consoleproxy``), listening on ``KUMO_CONSOLE_PROXY_BIND`` (127.0.0.1:6083).

Browsers and the CLI reach it at ``KUMO_CONSOLE_PROXY_URL``; it needs the database (to
redeem tokens) and each host's libvirt (``KUMO_CONSOLE_LIBVIRT_URI``). SIGTERM or Ctrl-C
stops it, ending the sessions in progress.
"""

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from compute.consoleproxy import ConsoleProxyServer, parse_bind


class Command(BaseCommand):
    help = "Run the websocket proxy to guests' serial consoles (KUMO_CONSOLE_PROXY_BIND)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--bind",
            default=settings.CONSOLE_PROXY_BIND,
            help="host:port to listen on (default KUMO_CONSOLE_PROXY_BIND, %(default)s)",
        )

    def handle(self, *args, bind, **options):
        try:
            host, port = parse_bind(bind)
        except ValueError as exc:
            raise CommandError(f"--bind: {exc}") from None
        server = ConsoleProxyServer(host, port)

        def stop(_signum, _frame):
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        self.stdout.write(f"console proxy listening on {bind}, advertised at "
                          f"{settings.CONSOLE_PROXY_URL}")  # fmt: skip
        self.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()

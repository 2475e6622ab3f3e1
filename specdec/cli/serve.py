"""`specdec serve`: load the model and run the app under uvicorn (loopback by default)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading

from ..errors import SpecdecError
from .options import add_model_args, gamma, port


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from ..api import SpecDec
    from ..server.app import LOOPBACK_HOSTS, create_app

    for name in ("max_queue", "spec_off_depth", "max_body_bytes", "max_batch", "row_budget"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.drain_timeout <= 86400:  # NaN fails too
        raise SpecdecError(f"--drain-timeout must be between 0 and 86400 seconds, got {args.drain_timeout}")
    check_can_listen(args.host, args.port)  # before the model loads: a port in use is a clear error in a second
    api_key = args.api_key or os.environ.get("SPECDEC_API_KEY") or None
    if args.allowed_hosts:
        allowed = None if args.allowed_hosts == ["*"] else tuple(args.allowed_hosts)
    else:  # on loopback, only loopback names: a web page cannot reach the server by DNS rebinding
        loopback = args.host in LOOPBACK_HOSTS or args.host.startswith("127.")
        allowed = (*LOOPBACK_HOSTS, args.host) if loopback else None
    sd = SpecDec(target=args.target, drafter=args.drafter, dtype=args.dtype, device=args.device, backend=args.backend,
                 weights=args.weights)
    sd.generate([sd.tokenizer.eos_token_id or 0], max_new_tokens=2, gamma=0)  # warm-up before the first client
    app = create_app(sd, args.served_model_name or args.target, api_key=api_key, max_queue=args.max_queue,
                     spec_off_depth=args.spec_off_depth, max_body_bytes=args.max_body_bytes, gamma=args.gamma,
                     allowed_hosts=allowed, cors_origins=tuple(args.cors_origins or ()), max_batch=args.max_batch,
                     row_budget=args.row_budget, worker_thread=False)
    print(f"specdec serving {args.target} (drafter {args.drafter}) on http://{args.host}:{args.port}/v1", file=sys.stderr)
    # The model runs in this thread, the one that loaded it (see specdec.server.worker); HTTP in another.
    # uvicorn waits for open connections a little longer than the drain, which ends every stream first.
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=args.drain_timeout + 5))
    worker = app.state.worker

    def shut_down(signum, frame) -> None:
        """SIGTERM or Ctrl-C: stop listening, let what runs finish (up to --drain-timeout), exit 0; a
        second signal ends the requests in flight at once (each stream still gets its last event)."""
        again = server.should_exit
        print(f"specdec: {signal.Signals(signum).name}: " + ("ending the requests in flight now" if again else
              f"draining (up to {args.drain_timeout:g} s; send it again to stop now)"), file=sys.stderr)
        server.should_exit = True
        worker.drain(0.0 if again else args.drain_timeout)

    previous = {sig: signal.signal(sig, shut_down) for sig in (signal.SIGTERM, signal.SIGINT)}
    http = threading.Thread(target=server.run, name="specdec-http", daemon=True)
    http.start()
    try:
        worker.run(until=lambda: not http.is_alive())
    finally:
        server.should_exit = True
        http.join(timeout=args.drain_timeout + 10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise SpecdecError(f"the HTTP server did not start on {args.host}:{args.port} (uvicorn's reason is above)")
    return 0


def check_can_listen(host: str, port: int) -> None:
    """Bind (host, port) as uvicorn will, and let go: an unknown host or a port in use fails here, clearly."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise SpecdecError(f"--host {host!r} is not an address to listen on ({exc.strerror}): give an address of this "
                           "machine, e.g. 127.0.0.1 (loopback) or 0.0.0.0 (every interface)") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own socket
        try:
            probe.bind(address)
        except OSError as exc:
            raise SpecdecError(f"cannot listen on {host}:{port}: {exc.strerror} (is another server there? choose "
                               "another --port)") from None


def register(sub) -> None:
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server")
    add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="default: %(default)s (loopback only)")
    serve.add_argument("--port", type=port, default=8000)
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every endpoint but /health (also read from "
                            "the SPECDEC_API_KEY environment variable, which keeps it out of the process list)")
    serve.add_argument("--allowed-hosts", nargs="+", default=None, metavar="HOST",
                       help="Host header values to answer (default: the loopback names when --host is loopback, "
                            "else any); '*' answers any")
    serve.add_argument("--cors-origins", nargs="+", default=None, metavar="ORIGIN",
                       help="browser origins allowed to call the API (CORS); default: none")
    serve.add_argument("--served-model-name", default=None, help="the model id clients use (default: --target)")
    serve.add_argument("--gamma", type=gamma, default="auto", help="default gamma for requests (default: auto)")
    serve.add_argument("--max-queue", type=int, default=16, help="requests waiting or running before 429 (default: 16)")
    serve.add_argument("--max-batch", type=int, default=8,
                       help="requests decoded together, one target pass a step for all (default: 8; 1 on backends "
                            "that hold one sequence, such as transformers)")
    serve.add_argument("--row-budget", type=int, default=16,
                       help="positions a step scores before gamma=auto requests draft less: each may draft "
                            "row_budget / running - 1 tokens (default: 16)")
    serve.add_argument("--spec-off-depth", type=int, default=None,
                       help="running requests from which gamma=auto requests do not speculate at all "
                            "(default: only the row budget limits it)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default: 1 MiB)")
    serve.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="on SIGTERM or Ctrl-C, stop accepting and give the requests in flight this long to "
                            "finish before they end with finish_reason 'abort' (default: %(default)g)")
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(handler=run)

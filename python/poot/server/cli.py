"""The ``poot-serve`` command: an OpenAI-compatible HTTP server on uvicorn.

It binds its socket first and prints one line, ``poot-serve: listening on http://HOST:PORT``,
then loads the model in the background (``/health`` answers 503 ``loading`` until it is
ready). ``--port 0`` takes any free port; the line says which. Binds to 127.0.0.1 unless
``--host`` says otherwise. ``--api-key`` (or ``POOT_API_KEY``; the command line is the one
place the server reads it) makes ``/v1/*`` require ``Authorization: Bearer <key>``.
SIGTERM or Ctrl-C drains: new requests get 503, running ones have ``--shutdown-timeout``
seconds to finish before they are cancelled (``poot.server.shutdown``); a second signal exits
at once. Exit codes: 0 after a clean shutdown, 1 when the model cannot be loaded (or on a
second signal), 2 for bad arguments.

The rows and the KV pool are fitted to the memory (``poot.server.loading``); the removed
``--max-num-seqs`` and ``--kv-cache-mib`` are refused with an error naming
``--device-budget``. ``POOT_SERVE_MAX_ROWS`` caps the rows, for tests and diagnosis.
``--log-level debug`` traces the start-up's phases (``poot.server.startup``).

``--ray --replicas N`` (``--autoscaling-config JSON`` for Serve's autoscaling) serves the
same API from N replicas of this server on the running Ray cluster (``RAY_ADDRESS``, else the
one this machine started), routed by prompt prefix (``poot.serve.ray``, docs/ray.md); it
prints the same "listening" line once the replicas are up, and removes its Serve
application on SIGTERM or Ctrl-C. Without Ray or a cluster it exits with 1 and says why.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from poot import _native
from poot.checkpoints import DEFAULT_SPEC, SPEC_FORMS
from poot.errors import ConfigError
from poot.server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig, parse_size
from poot.server.startup import Phase

if TYPE_CHECKING:
    from poot.llm import LLM

__all__ = ["build_parser", "main"]

API_KEY_ENV = "POOT_API_KEY"
ROWS_ENV = "POOT_SERVE_MAX_ROWS"
BACKENDS = ("cpu", "wgpu", "vulkan", "cuda")


def build_parser() -> argparse.ArgumentParser:
    d = ServerConfig()
    p = argparse.ArgumentParser(
        prog="poot-serve",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
        "/v1/chat/completions, /v1/models) with /health and /metrics.",
        epilog="examples:\n"
        "  poot-serve\n"
        "  poot-serve --model path/to/model.gguf --port 9000 --api-key KEY\n"
        "  poot-serve --backend wgpu --max-model-len 2048\n"
        "  poot-serve --model big.gguf --device-budget 4GiB --spill-dir /data/spill\n"
        "  poot-serve --ray --replicas 4 --model model.gguf --threads 8\n\n"
        "exit codes:\n"
        "  0    stopped cleanly (SIGTERM or Ctrl-C: drained, see --shutdown-timeout)\n"
        "  1    the model could not be loaded, the server failed, a second signal, or\n"
        "       --ray without Ray installed or a cluster to join\n"
        "  2    bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        metavar="SPEC",
        help=f"the model (default: {DEFAULT_SPEC!r}, pulled on first run); {SPEC_FORMS}",
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)"
    )
    p.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV} if set)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="cpu",
        help="device backend (default cpu; wgpu: Vulkan; vulkan: raw Vulkan, not production; "
        "cuda: an NVIDIA GPU)",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--served-model-name", default=None, help="the model name clients send")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="tokens per sequence (default: the model's context, at most 4096)",
    )
    p.add_argument(
        "--device-budget",
        metavar="SIZE",
        default=None,
        help="bytes the model may use on its device (e.g. 512MiB): weights, KV pool, buffers; "
        "the rows and the KV pool are fitted to what the weights leave, and weights that do "
        "not fit are streamed (default: no limit; the KV pool takes half the free RAM on the "
        "CPU, 90%% of the GPU's memory on CUDA, 1 GiB on wgpu)",
    )
    p.add_argument(
        "--host-budget",
        metavar="SIZE",
        default=None,
        help="host bytes for weights streamed from RAM (default: the RAM that is free)",
    )
    p.add_argument(
        "--spill-dir",
        default=None,
        help="where streamed weights' buffer files go (default: <cache>/spill)",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=d.stall_timeout_s,
        help="seconds a streamed weight load may make no progress before the step fails "
        f"(default {d.stall_timeout_s:g})",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=d.max_queue,
        help=f"requests that may wait for a row; more get 429 (default {d.max_queue})",
    )
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=d.queue_timeout_s,
        help=f"seconds a request may wait in the queue (default {d.queue_timeout_s:g})",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout_s,
        help=f"seconds a request may take in all (default {d.request_timeout_s:g})",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help=f"largest request body (default {d.max_body_bytes})",
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=d.step_timeout_s,
        help="seconds one engine step may take before the runtime counts as dead "
        f"(default {d.step_timeout_s:g})",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=d.shutdown_timeout_s,
        help="on SIGTERM/Ctrl-C, seconds running requests may take before they are cancelled "
        f"(default {d.shutdown_timeout_s:g})",
    )
    p.add_argument("--max-n", type=int, default=d.max_n, help=f"largest n (default {d.max_n})")
    p.add_argument(
        "--chat-template",
        metavar="FILE_OR_TEXT",
        default=None,
        help="a Jinja chat template (a file, or the template itself) instead of the model's",
    )
    ray = p.add_argument_group("Ray Serve (docs/ray.md; needs pip install 'poot[ray]')")
    ray.add_argument(
        "--ray",
        action="store_true",
        help="serve on the running Ray cluster (RAY_ADDRESS, else the one this machine "
        "started): --replicas engines behind this endpoint, prompts routed by prefix",
    )
    ray.add_argument(
        "--replicas", type=int, default=None, help="engine replicas with --ray (default 1)"
    )
    ray.add_argument(
        "--autoscaling-config",
        metavar="JSON",
        default=None,
        help="Serve's autoscaling_config for the engines with --ray, as JSON "
        '(e.g. \'{"min_replicas": 1, "max_replicas": 4}\'); replaces --replicas',
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars (pulling, preparing weights)"
    )
    return p


# Flags that were removed, and what replaces them (named in the error).
_GONE = {
    "--max-num-seqs": "the rows are fitted to the memory that is free",
    "--kv-cache-mib": "the KV pool is fitted to the memory that is free",
}


def _refuse_gone_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in _GONE:
            parser.error(
                f'{flag} is gone: {_GONE[flag]} (docs/server.md, "Rows and the KV pool"); '
                "to bound the memory poot-serve takes, use --device-budget SIZE "
                "(and --host-budget SIZE for weights streamed from RAM)"
            )


def _max_rows() -> int | None:
    """``POOT_SERVE_MAX_ROWS``, for tests and diagnosis (None when unset)."""
    text = os.environ.get(ROWS_ENV)
    if text is None or not text.strip():
        return None
    try:
        rows = int(text)
    except ValueError:
        rows = 0
    if rows < 1:
        raise ConfigError(f"{ROWS_ENV} must be an integer >= 1, got {text!r}")
    return rows


def _config(args: argparse.Namespace) -> ServerConfig:
    template = args.chat_template
    if template is not None and "{" not in template:
        try:
            template = Path(template).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"--chat-template {args.chat_template!r}: {e}") from None
    return ServerConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        api_key=args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV),
        threads=args.threads,
        max_model_len=args.max_model_len,
        max_rows=_max_rows(),
        max_queue=args.max_queue,
        queue_timeout_s=args.queue_timeout,
        request_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        max_n=args.max_n,
        chat_template=template,
        step_timeout_s=args.step_timeout,
        backend=args.backend,
        progress=not args.quiet,
        shutdown_timeout_s=args.shutdown_timeout,
        device_budget_bytes=None if args.device_budget is None else parse_size(args.device_budget),
        host_budget_bytes=None if args.host_budget is None else parse_size(args.host_budget),
        spill_dir=args.spill_dir,
        stall_timeout_s=args.stall_timeout,
    )


def _start_loading(config: ServerConfig, phase: Phase) -> Future[LLM]:
    """Loads the model on a new thread (``poot.server.loading.load_llm``); the future holds the
    ``LLM`` or the error."""
    # Imported here, before the thread starts: the web stack imported meanwhile on the main
    # thread shares no module with it, so the two threads never wait on each other's imports.
    from poot.server.loading import load_llm

    phase.done("model code imported")
    future: Future[LLM] = Future()

    def work() -> None:
        try:
            phase = Phase()
            llm = load_llm(config)
            phase.done("model loaded")
            future.set_result(llm)
        except BaseException as e:  # the app's loader re-raises it (a fatal load error)
            future.set_exception(e)

    threading.Thread(target=work, name="poot-load", daemon=True).start()
    return future


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _serve_on_ray(
    parser: argparse.ArgumentParser, args: argparse.Namespace, config: ServerConfig
) -> int:
    """``--ray``: the same server as N replicas on Ray Serve (``poot.serve.ray``)."""
    if not args.ray:
        parser.error("--replicas and --autoscaling-config need --ray")
    autoscaling = None
    if args.autoscaling_config is not None:
        try:
            autoscaling = json.loads(args.autoscaling_config)
        except ValueError as e:
            parser.error(f"--autoscaling-config is not JSON: {e}")
        if not isinstance(autoscaling, dict):
            parser.error("--autoscaling-config must be a JSON object")
    from poot.serve.ray import run_cli

    try:
        return run_cli(
            config,
            host=args.host,
            port=args.port,
            replicas=1 if args.replicas is None else args.replicas,
            autoscaling_config=autoscaling,
        )
    except ConfigError as e:
        parser.error(str(e))
    except (ImportError, ConnectionError) as e:  # RayNotInstalledError, RayClusterError
        sys.stderr.write(f"poot-serve: error: {e}\n")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``poot-serve``; return its exit code."""
    phase = Phase(from_process_start=True)
    parser = build_parser()
    _refuse_gone_flags(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.backend == "cuda" and not _native.cuda_devices():
        parser.error(
            "--backend cuda: no CUDA device is visible (no NVIDIA driver, or this build lacks "
            "the cuda feature); use --backend cpu or wgpu"
        )
    try:
        config = _config(args)
    except ConfigError as e:
        parser.error(str(e))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.ray or args.replicas is not None or args.autoscaling_config is not None:
        return _serve_on_ray(parser, args, config)
    phase.done("interpreter started, poot-serve imported, arguments read")

    try:
        sock = _bind(args.host, args.port)
    except OSError as e:
        sys.stderr.write(f"poot-serve: error: cannot listen on {args.host}:{args.port}: {e}\n")
        return 1
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"poot-serve: listening on http://{shown}:{port}", flush=True)
    phase.done("listening")
    # The model loads from here on, on its own thread, while the web stack is imported: its
    # slow parts (preparing the weights, the KV pool) run without the GIL.
    loading = _start_loading(config, phase)

    # Jinja, for chat templates: the model's own import leaves it to the first render, and a
    # chat request should not pay for it, so it is imported here, while the weights are
    # prepared, rather than before the load could start.
    import poot.tokenizer.chat  # noqa: F401
    from poot.server.app import create_app
    from poot.server.shutdown import DrainingServer
    from poot.server.uvicorn_core import Config, Server

    phase.done("web stack imported")

    fatal: list[str] = []
    server: Server | None = None

    def on_fatal(message: str) -> None:
        fatal.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(config, loader=loading.result, on_fatal=on_fatal)
    server = DrainingServer(
        Config(
            app,
            log_level=args.log_level,
            access_log=args.access_log,
            timeout_graceful_shutdown=5,
            lifespan="on",
            # The API has no WebSocket route: "auto" would import a WebSocket protocol
            # (the websockets package) at start for nothing.
            ws="none",
        ),
        app.state.poot,
        config.shutdown_timeout_s,
    )
    phase.done("app created")
    server.run(sockets=[sock])
    if fatal:
        sys.stderr.write(f"poot-serve: error: {fatal[0]}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

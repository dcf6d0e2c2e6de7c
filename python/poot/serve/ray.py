"""``poot.serve.ray``: N poot engines behind one OpenAI-compatible endpoint, on Ray Serve.

``build_app(model, replicas=N)`` returns a Serve application of two deployments:

- ``PootEngine`` (``poot.serve.replica``): N replicas, each a whole ``poot-serve`` app (routes,
  errors, API key, queue limits, metrics, cancel-by-id) over its own engine;
- ``PootIngress`` (``poot.serve.ingress``): the HTTP entry, which forwards each request to an
  engine replica through Serve's request-router extension point (``PrefixRouter``,
  ``poot.serve.router``: prompts that share leading blocks go to the replica that holds them,
  a busy one gives way to the least-loaded) and answers health and metrics over all replicas.

Compose it like any Serve application::

    from ray import serve
    from poot.serve.ray import build_app

    serve.run(build_app("model.gguf", replicas=4), name="poot", route_prefix="/")
    serve.run(build_app(cfg, autoscaling_config={"min_replicas": 1, "max_replicas": 8}))

``autoscaling_config`` goes to Serve unchanged (then ``replicas`` is unused). A Serve config
file (``serve run``, KubeRay's ``RayService``) names ``poot.serve.ray:app_builder`` with the
same settings as ``args``. ``poot-serve
--ray --replicas N`` does the same on the cluster ``ray.init(address="auto")`` finds (or
``RAY_ADDRESS``), and removes the application when it stops. This module imports Ray only
when called: without it, the calls raise ``RayNotInstalledError``; without a cluster,
``RayClusterError``. docs/ray.md has the deployment guide and a KubeRay manifest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from poot.errors import ConfigError, PootError
from poot.server.config import ServerConfig

if TYPE_CHECKING:
    from ray.serve import Application

__all__ = [
    "ENGINE",
    "INGRESS",
    "app_builder",
    "RayClusterError",
    "RayNotInstalledError",
    "build_app",
    "connect",
    "run_cli",
]

ENGINE = "PootEngine"
INGRESS = "PootIngress"


class RayNotInstalledError(PootError, ImportError):
    """Ray Serve is needed (``poot-serve --ray``, ``poot.serve.ray``) and is not installed."""

    hint = "Install it with: pip install 'poot[ray]'"


class RayClusterError(PootError, ConnectionError):
    """No running Ray cluster could be reached."""

    hint = "Start one (ray start --head) or point RAY_ADDRESS at it (e.g. RAY_ADDRESS=HOST:6379)"


def _require_ray() -> None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as e:
        raise RayNotInstalledError(f"Ray Serve is not installed ({e})") from None


def connect(address: str | None = None) -> None:
    """Joins the running cluster at ``address`` (default: ``RAY_ADDRESS``, else ``"auto"``,
    the cluster this machine started) as a driver; does nothing if already joined.

    Raises:
        RayNotInstalledError: Ray Serve is not installed.
        RayClusterError: no cluster there.
    """
    _require_ray()
    import ray

    if ray.is_initialized():
        return
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=where, logging_level=logging.WARNING, log_to_driver=False)
    except ConnectionError as e:
        raise RayClusterError(f"no running Ray cluster at {where!r}: {e}") from None


def build_app(
    model: str | ServerConfig | None = None,
    *,
    replicas: int = 1,
    autoscaling_config: Mapping[str, Any] | None = None,
    replica_actor_options: Mapping[str, Any] | None = None,
    max_ongoing_requests: int = 64,
    busy_requests: int = 8,
    ingress_replicas: int = 1,
    routing: str = "prefix",
) -> Application:
    """The Serve application (module docs).

    Args:
        model: the model spec, or a whole ``ServerConfig`` (the settings of every replica:
            API key, limits, timeouts, budgets, backend).
        replicas: engine replicas (without ``autoscaling_config``).
        autoscaling_config: Serve's ``autoscaling_config`` for the engine deployment, as is.
        replica_actor_options: Ray actor options of each engine replica (default: one CPU;
            e.g. ``{"num_cpus": 8}``, ``{"num_gpus": 1}``). Without ``threads`` in the config,
            an engine runs as many CPU threads as its ``num_cpus``.
        max_ongoing_requests: requests Serve sends one engine replica at once; the replica's
            own queue (``ServerConfig.max_queue``) answers 429 beyond its rows.
        busy_requests: how many more ongoing requests than the least-loaded replica make a
            replica busy, so a prompt whose prefix it holds goes to the least-loaded replica
            instead.
        ingress_replicas: replicas of the HTTP ingress (each routes with its own prefix
            table; one keeps every prefix's history in one place).
        routing: ``"prefix"`` (``PrefixRouter``) or ``"round_robin"`` (``RoundRobinRouter``,
            the baseline of ``benches/bench_ray_routing.py``).

    Raises:
        ConfigError: a count below 1, or an unknown ``routing``.
        RayNotInstalledError: Ray Serve is not installed.
    """
    config = model if isinstance(model, ServerConfig) else ServerConfig(model=model)
    for name, value in (
        ("replicas", replicas),
        ("max_ongoing_requests", max_ongoing_requests),
        ("busy_requests", busy_requests),
        ("ingress_replicas", ingress_replicas),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if routing not in ("prefix", "round_robin"):
        raise ConfigError(f'routing must be "prefix" or "round_robin", got {routing!r}')
    _require_ray()
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from poot.serve.ingress import PootIngress
    from poot.serve.replica import PootReplica
    from poot.serve.router import PrefixRouter, RoundRobinRouter

    actor_options = dict(replica_actor_options or {"num_cpus": 1})
    cpus = actor_options.get("num_cpus")
    # Replicas log to Ray's files: no progress bars there. An engine uses the CPUs Ray gives
    # its replica, not every core of the node (other replicas share them).
    threads = config.threads
    if threads is None and isinstance(cpus, int | float) and cpus >= 1:
        threads = int(cpus)
    config = dataclasses.replace(config, progress=False, threads=threads)
    scaling: dict[str, Any] = (
        {"autoscaling_config": dict(autoscaling_config)}
        if autoscaling_config is not None
        else {"num_replicas": replicas}
    )
    router: type = PrefixRouter if routing == "prefix" else RoundRobinRouter
    engine = serve.deployment(
        name=ENGINE,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options=actor_options,
        request_router_config=RequestRouterConfig(
            request_router_class=router,  # type: ignore[arg-type]  # Ray's stub says dict
            request_router_kwargs={"busy_requests": busy_requests} if routing == "prefix" else {},
        ),
        graceful_shutdown_timeout_s=config.shutdown_timeout_s,
        **scaling,
    )(PootReplica).bind(config)
    ingress = serve.deployment(
        name=INGRESS,
        num_replicas=ingress_replicas,
        # It only moves bytes: no CPU reserved, so it fits beside the engines.
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max(config.max_queue, 1) * 16,
    )(PootIngress)
    return ingress.bind(engine, config, ENGINE)


_BUILD_OPTIONS = (
    "replicas",
    "autoscaling_config",
    "replica_actor_options",
    "max_ongoing_requests",
    "busy_requests",
    "ingress_replicas",
    "routing",
)


def app_builder(args: Mapping[str, Any]) -> Application:
    """``build_app`` from a Serve config's ``args`` (``import_path: poot.serve.ray:app_builder``
    in a ``serve run`` config or a KubeRay ``RayService``): ``ServerConfig`` fields (``model``,
    ``max_model_len``, ``threads``, ...) and ``build_app``'s options (``replicas``,
    ``autoscaling_config``, ...). The API key, when not given, comes from ``POOT_API_KEY``
    (a Kubernetes secret in the pod's environment, say), never from the config file.

    Raises:
        ConfigError: an argument that is neither, or a bad value.
    """
    fields = {f.name for f in dataclasses.fields(ServerConfig)}
    unknown = sorted(set(args) - fields - set(_BUILD_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown poot.serve.ray argument(s) {unknown}: give ServerConfig fields or "
            f"build_app options ({', '.join(_BUILD_OPTIONS)})"
        )
    settings = {k: v for k, v in args.items() if k in fields}
    if settings.get("api_key") is None and os.environ.get("POOT_API_KEY"):
        settings["api_key"] = os.environ["POOT_API_KEY"]
    options = {k: v for k, v in args.items() if k in _BUILD_OPTIONS}
    return build_app(ServerConfig(**settings), **options)


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_cli(
    config: ServerConfig,
    *,
    host: str,
    port: int,
    replicas: int,
    autoscaling_config: Mapping[str, Any] | None = None,
    name: str = "poot",
) -> int:
    """``poot-serve --ray``: deploys ``build_app`` on the running cluster, prints where it
    listens, and serves until SIGTERM or Ctrl-C, then deletes the application.

    Each engine replica reserves ``config.threads`` CPUs (one without ``--threads``) and, on
    CUDA, one GPU. Serve's HTTP proxy listens on the head node only
    (``proxy_location="HeadOnly"``), at ``host:port`` (0: a free port), unless Serve already
    runs on the cluster with other HTTP options (Serve keeps those).

    Raises:
        RayNotInstalledError, RayClusterError, ConfigError: as ``connect`` and ``build_app``.
    """
    # Each replica reserves what it will use: its threads, and a GPU on CUDA.
    options: dict[str, Any] = {"num_cpus": config.threads or 1}
    if config.backend == "cuda":
        options["num_gpus"] = 1
    app = build_app(
        config,
        replicas=replicas,
        autoscaling_config=autoscaling_config,
        replica_actor_options=options,
    )
    connect()
    from ray import serve

    port = port or _free_port(host)
    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
    serve.run(app, name=name, route_prefix="/")
    shown = f"[{host}]" if ":" in host else host
    print(f"poot-serve: listening on http://{shown}:{port} (Ray Serve app {name!r})", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.delete(name)
    return 0

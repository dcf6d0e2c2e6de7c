"""Serving poot beyond one process.

``poot.serve.ray``: N poot engines behind one OpenAI-compatible endpoint on Ray Serve
(``build_app``; ``poot-serve --ray``), with prefix-aware routing. Its parts: ``prefix`` (prompt
prefix keys, the KV cache's block hash; no Ray), ``router`` (Serve's request-router extension
point), ``replica`` (one ``poot-serve`` app per Serve replica) and ``ingress`` (the HTTP entry).
Only ``prefix`` and ``ray`` import without Ray installed.
"""

"""Serving poot beyond one process.

``poot.serve.ray``: N poot engines behind one OpenAI-compatible endpoint on Ray Serve
(``build_app``; ``poot-serve --ray``), with prefix-aware routing. Its parts: ``prefix`` (prompt
prefix keys, the KV cache's block hash; no Ray), ``router`` (Serve's request-router extension
point), ``replica`` (one ``poot-serve`` app per Serve replica) and ``ingress`` (the HTTP entry).

``poot.serve.nodes``: one model placed across the nodes of a Ray cluster
(``poot.LLM(model, config=NodesConfig(...))``), over ``cluster`` (nodes and links measured on
the cluster), ``placement`` (one actor per segment) and ``segments`` (the actor and the step
runtime over the actors). These import Ray only when called.

Only ``prefix``, ``ray``, ``cluster``, ``nodes``, ``placement`` and ``segments`` import without
Ray installed.
"""

"""The Kubernetes adapter: the ``Fleet`` port, the drill conductor and the controller's lease on a
real cluster's API.

Why lightkube: it is small, typed (``py.typed``, dataclass models for every core kind, generic
resources for CRDs), synchronous like the control plane, and built on httpx2, so every request
the adapter sends goes through one ``BaseTransport.handle_request``. That single seam is where
the adapter records the exact request for its journal (``transport.py``) and where the tests
replay apiserver responses through ``httpx2.MockTransport`` without an apiserver. The official
``kubernetes`` client is generated, untyped and drags urllib3 and a websocket stack; kr8s is
async-first; kubernetes-asyncio would force an event loop on a synchronous control plane.

Modules:

- ``conventions``: the names, labels and annotations firedrill reads and writes on a cluster;
- ``transport``: the recording transport and the typed request records (the journal's lines);
- ``errors``: apiserver answers mapped onto firedrill's error tree;
- ``fleet``: ``KubernetesFleet``, every mapped operation and its inverse, dry run first;
- ``watch``: list-then-watch caches (resourceVersion, bookmarks, relist on 410 Gone);
- ``schemas``: request bodies validated against kubernetes-validate and upstream CRDs;
- ``conductor``: a drill's Chaos Mesh ``Workflow`` created, stopped and recovered through the API;
- ``lease``: leader election on a ``coordination.k8s.io`` Lease;
- ``operator``: the remediation controller as a long-running, leader-elected process.
"""

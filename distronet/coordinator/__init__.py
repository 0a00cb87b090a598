"""The coordinator: runs, admissions, shard leases, the contribution ledger (``distro-coordinator``).

Layout (top to bottom): ``cli`` (flags, signals) -> ``local`` (the one serve function, used by
the CLI and the tests) -> ``hotpath`` (the hand-written HTTP/1.1 way in for the four hot node
routes) and ``app`` (aiohttp: every route, the request pipeline) -> ``handlers`` (one function
per route) -> ``routes`` (the route table and the request context) -> ``service`` (operations
on memory state) -> ``runs`` / ``leases`` (state) -> ``groupcommit`` -> ``store`` (SQLite,
whose one writer is a child process, or PostgreSQL). ``auth``, ``sessions``, ``events``
(SSE), ``metrics``, ``openapi``, ``config`` and ``trace`` (opt-in diagnostics) sit beside them.

Errors::

    DistroError
    └── CoordinatorError
        ├── StoreError        the database could not be opened, migrated or written
        └── RunConfigError    a run file or definition is invalid
    (API refusals are distronet.protocol.coordinator_api.ApiError, a ProtocolError)
"""

"""The coordinator: runs, admissions, shard leases, the contribution ledger (``distro-coordinator``).

Layout (top to bottom): ``cli`` (serve) -> ``app`` (routes, request pipeline) -> ``handlers``
-> ``service`` (operations on memory state) -> ``runs`` / ``leases`` (state) ->
``groupcommit`` -> ``store`` (SQLite / PostgreSQL). ``auth``, ``events`` (SSE), ``metrics``,
``openapi``, ``config`` and ``local`` (an in-process server for tests) sit beside them.

Errors::

    DistroError
    └── CoordinatorError
        ├── StoreError        the database could not be opened, migrated or written
        └── RunConfigError    a run file or definition is invalid
    (API refusals are distronet.protocol.coordinator_api.ApiError, a ProtocolError)
"""

"""Authentication and authorization for the embedded engine (``--auth``).

- ``scram``: SCRAM-SHA-256 / SCRAM-SHA-1 credentials and exchanges (the ``scramp`` package);
- ``handshake``: ``saslStart`` / ``saslContinue`` and the handshake's speculative step;
- ``catalog``: users and roles, stored in ``admin.system.users`` / ``admin.system.roles``;
- ``builtin_roles``, ``privileges``: MongoDB's role and privilege model as data;
- ``session``: one connection's authentication state;
- ``checks``: the privilege check every command passes (error 13 as mongod answers it).

The commands themselves are in ``commands/users.py``; docs/engine.md, "Authentication and
roles", says what is supported and what is not.
"""

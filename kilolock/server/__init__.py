"""``kl serve``: Terraform's and OpenTofu's ``backend "http"`` over the Kilolock store.

Modules, in the order a request flows through them: ``http`` (sockets, framing, limits) →
``auth`` (who is asking) → ``kilolock.names`` (which state) → ``backend`` / ``api`` (what the protocol
means) → ``store_ops`` (each request as one transaction on the store) → kilolock.store.
"""

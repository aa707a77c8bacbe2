"""Notifications: the payloads (payload.py) and their delivery after commit (deliver.py).
The events themselves are written by the store, in the transaction that causes them (store/notify.py)."""

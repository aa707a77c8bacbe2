"""Discovery of unmanaged objects: what a provider lists of a resource type (ListResource, plugin
protocol 5.10/6.10), matched against every state's open instances by identity.

Module map: matching (a listed identity -> the open instances that claim it: the one seam onto the
identity index) → service (a run: open the provider through the refresh factory, list, match,
record, notify). The CLI (kilolock.cli.discovercmd) renders what a run found.
"""

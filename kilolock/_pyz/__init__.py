"""Running from ``kl.pyz``: the zip holds pure-Python code (imported in place) and native files
(extracted on first use into a per-build cache dir, then imported from there).

``manifest`` reads what the build recorded; ``cache`` finds the cache dir and extracts into it
safely; ``finder`` is the import hook that maps native module names to the extracted files;
``entry`` is what the zip's ``__main__`` calls. Only the standard library is used here.
"""

"""Push delivery: dispatcher loops (``dispatcher``) POSTing jobs to callback URLs (``delivery``)."""

"""The broker's web server: gunicorn's master with a worker of our own (``worker.BrokerWorker``,
``worker_class`` in gunicorn.conf.py), an HTTP/1.1 server on an event loop (uvloop) with llhttp's
parser (httptools) in each worker (``http``). The hot single publish is answered on the event loop
(``native``); every other request runs Django's WSGI application in a thread of a pool (``wsgi``).

``http`` and ``wsgi`` know nothing of Django (gunicorn's master imports the worker class before
Django is configured); ``native`` is the Django side: its route table, the checks the full stack
would make first, and the answers, the same as the full stack's.
"""

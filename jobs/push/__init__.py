"""Push consumers: the dispatcher loop (``dispatcher``), the claim across every push consumer
(``claim``), an attempt's headers and how its answer reads (``delivery``), the record of finished
attempts (``record``) and the circuit breaker (``circuit``). The HTTP client is ``jobs.callbacks``."""

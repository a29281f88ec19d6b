"""The job state machine's rules: the statuses and the one transition table every status writer
checks (``transitions``), and the retry policy (``retries``). Pure, no database; the writers
themselves sit next to the protocol code that calls them (their packages say where)."""

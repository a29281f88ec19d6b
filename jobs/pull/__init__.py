"""Pull consumers, one module per step of the protocol: who is asking (``auth``, ``fields``), the
batch pull with its long-poll wait (``claim``; ``serve`` decides between it and the priority-group
dispatcher of ``groups``), acks and progress (``ack``), the pull-consumer spec path (``spec``), the
JSON shapes (``shapes``), purging a backlog (``purge``), waking waiting pulls (``wakeups``) and
ringing a consumer's doorbell (``doorbell``)."""

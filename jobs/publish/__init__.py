"""Publishing: who may publish (``auth``), storing a message and fanning it out to one QUEUED job per
consumer in one statement (``messages``), publishing later (``scheduled``) and delivering a
window of stored messages again (``replay``)."""

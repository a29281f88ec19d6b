"""Advisory-lock keys shared by modules that must not import each other."""

PUSH_CLAIM_LOCK = 0x70757368  # pg_advisory_xact_lock key serializing push claims ("push")

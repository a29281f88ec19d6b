"""Python client for the message and webhook broker: publish, pull and consume, verify webhooks.

    from broker_client import Producer, PullConsumer, verify_webhook
"""

from broker_client.consume import ConsumeStats, Reject, Retry
from broker_client.consumer import PullConsumer
from broker_client.errors import (
    BadRequest, BrokerError, Conflict, Forbidden, JobError, NotFound, PayloadTooLarge, PinMismatch,
    PreconditionFailed, RateLimited, Unauthorized, Unavailable, WebhookVerificationError,
)
from broker_client.http import RetryPolicy
from broker_client.jobs import Job
from broker_client.producer import BatchResult, Producer
from broker_client.webhooks import WebhookRequest, verify_webhook, webhook_app

__version__ = "0.1.0"

__all__ = [
    "Producer", "BatchResult", "PullConsumer", "Job", "ConsumeStats", "Retry", "Reject", "RetryPolicy",
    "verify_webhook", "webhook_app", "WebhookRequest",
    "BrokerError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "PreconditionFailed",
    "PayloadTooLarge", "PinMismatch", "RateLimited", "Unavailable", "JobError", "WebhookVerificationError",
]

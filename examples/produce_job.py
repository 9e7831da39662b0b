#!/usr/bin/env python3
"""Write one Herald push job straight to Kafka, without herald-ingest (pip install confluent-kafka).

    python3 examples/produce_job.py --brokers 127.0.0.1:9092 --app shop --channel order:42:status \
        --secret-file keys/shop-jobs.secret

A job is one JSON object per record on `herald.jobs`, in the format of schemas/push-job.schema.json (version 1).
The record key decides the partition, so one target's jobs stay in order; use exactly:

    channel jobs  <appId>/<channel>          target {"kind": "channel", "channel": ...}
    post jobs     <appId>/post/<postIdHash>  target {"kind": "post", "postIdHash": ...}
    device jobs   <appId>/device/<sha256>    target {"kind": "device", "deviceToken": <lowercase hex>, "tokenType": ...}

Sign every record: the header `herald-signature` is `v1=` and the lowercase hex HMAC-SHA256 of the exact value
bytes, keyed with one of the app's job-signing secrets (the first of `jobSigningSecretPaths` in the apps file; the
file's bytes, surrounding whitespace trimmed). herald-dispatcher dead-letters an unsigned or badly signed record
(reason `invalid_signature`) and a job whose appId is not the key's app (reason `invalid_job`), sending nothing.

(<sha256>: lowercase hex SHA-256 of the lowercase hex token: a key names a device without carrying its token.)

Produce with acks=all and the idempotent producer, and count a job as sent only once its delivery report says so.
herald-dispatcher checks every job and dead-letters an invalid one (reason `invalid_job`) to herald.dlq.
Prints the job it wrote (one JSON line) and exits non-zero if the broker did not acknowledge it.
"""
import argparse
import hashlib
import hmac
import json
import sys
import uuid
from datetime import datetime, timezone

from confluent_kafka import Producer


def channel_job(app_id: str, channel: str) -> dict:
    """An order-status event for every subscriber of `channel`: each gets the part of its token type."""
    return {
        "version": 1,
        "id": str(uuid.uuid4()),  # reuse the same id when retrying: dead letters and replays refer to it
        "appId": app_id,
        "createdAt": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "target": {"kind": "channel", "channel": channel},
        # alert subscribers: a complete APNs payload; custom keys beside "aps" reach the app.
        "alert": {"aps": {"alert": {"title": "Order shipped", "body": "Your order #42 is on its way"},
                          "sound": "default"},
                  "orderId": 42},
        # liveactivity-update subscribers: Herald adds aps.timestamp and aps.event when it sends.
        "liveActivity": {"event": "update", "contentState": {"status": "shipped"}, "staleDate": 1900000000},
        "priority": 10,
        "collapseId": "order-42",
    }


def signature(value: bytes, secret_file: str) -> str:
    """The herald-signature header's value for a record value."""
    with open(secret_file, "rb") as f:
        secret = f.read().strip()
    return "v1=" + hmac.new(secret, value, hashlib.sha256).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="herald.jobs")
    parser.add_argument("--app", required=True, help="an app id of the apps file")
    parser.add_argument("--channel", required=True)
    parser.add_argument("--secret-file", required=True, help="the app's job-signing secret (jobSigningSecretPaths)")
    args = parser.parse_args()

    job = channel_job(args.app, args.channel)
    producer = Producer({
        "bootstrap.servers": args.brokers,
        "enable.idempotence": True,  # implies acks=all: a job is acknowledged only once the broker stored it
        "acks": "all",
        "message.timeout.ms": 10000,
    })
    failures = []
    value = json.dumps(job, separators=(",", ":")).encode()
    producer.produce(args.topic, key=f"{args.app}/{args.channel}".encode(), value=value,
                     headers=[("herald-signature", signature(value, args.secret_file))],
                     on_delivery=lambda err, _msg: err is not None and failures.append(err))
    if producer.flush(15) > 0 or failures:
        print(f"job {job['id']} not acknowledged: {failures or 'timed out'}", file=sys.stderr)
        return 1
    print(json.dumps(job))
    return 0


if __name__ == "__main__":
    sys.exit(main())

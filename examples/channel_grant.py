#!/usr/bin/env python3
"""Issue a channel grant: what an app's backend gives a signed-in user's device to subscribe to a private channel.

    python3 examples/channel_grant.py --secret-file keys/shop-grants.secret --app shop --channel order:42:status

A grant is a JWT, HS256 with the app's grant secret (channelGrantSecretPath in the apps file; the file's bytes,
surrounding whitespace trimmed), claims `app`, `exp` (at most 24 h ahead) and `channel` (one exact name) or
`channels` (exact names, or prefixes ending in `*`). The device sends it as `channelGrant` in its subscription
body or as the X-Herald-Channel-Grant header. Standard library only; any JWT library does the same.
"""
import argparse
import base64
import hashlib
import hmac
import json
import time


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def channel_grant(secret: bytes, app: str, channels: list, ttl: int = 600) -> str:
    claims = {"app": app, "exp": int(time.time()) + ttl}
    if len(channels) == 1 and not channels[0].endswith("*"):
        claims["channel"] = channels[0]
    else:
        claims["channels"] = channels
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--app", required=True)
    parser.add_argument("--channel", required=True, action="append", help="a name, or a prefix ending in *; repeatable")
    parser.add_argument("--ttl", type=int, default=600, help="seconds the grant is valid (at most 86400)")
    args = parser.parse_args()
    with open(args.secret_file, "rb") as f:
        secret = f.read().strip()
    print(channel_grant(secret, args.app, args.channel, args.ttl))


if __name__ == "__main__":
    main()

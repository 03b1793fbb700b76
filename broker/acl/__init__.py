"""Apache RocketMQ 4.9's plain ACL, for the broker and the name server.

One module per job, in the order a request meets them:

* :mod:`.signature` — the request signature (``AclUtils.combineRequestContent`` + HMAC-SHA1 + Base64),
  used by the server to verify and by our client to sign (``AclClientRPCHook``);
* :mod:`.permission` — DENY/ANY/PUB/SUB, ``"PUB|SUB"`` parsing, the admin-only request codes;
* :mod:`.remote_address` — whitelist forms (``*``, ``192.168.*.*``, ``192.168.1.{1,2}``, ``1-200``, IPv6);
* :mod:`.config` — the ``plain_acl.yml`` loader (a bad file is an error naming the field);
* :mod:`.resources` — what a request needs (``PlainAccessResource.parse``);
* :mod:`.validator` — Apache's check order (``PlainPermissionManager.validate``);
* :mod:`.gate` — the file, reloaded when it changes, and the denial a client gets.
"""

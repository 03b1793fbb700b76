"""Message filtering by SQL92 property expressions (Apache RocketMQ 4.9's ``enablePropertyFilter``).

:mod:`.sql92` parses selectors, :mod:`.expressions` evaluates them, :mod:`.java_values` holds the
Java type rules both follow, and :mod:`.consumer_filter` decides, per pull, which messages a
consumer's subscription selects and which subscriptions the broker refuses.
"""

"""Consumer/producer registry: registration, rebalance notifications, expiry."""

from broker.remoting.bodies import HeartbeatData
from broker.server.clients import ClientRegistry

CPP_PUSH = (b'{"clientID":"2912-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
            b'"groupName":"CG_TEST","messageModel":1,"subscriptionDataSet":[{"subString":"*",'
            b'"subVersion":"1795240935588","topic":"%RETRY%CG_TEST"},{"codeSet":[0,0],"subString":"TagA || TagB",'
            b'"subVersion":"1795240935588","tagsSet":["TagA","TagB"],"topic":"TopicTest"}]}]}\n')


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_join_leave_and_notifications():
    clock = Clock()
    reg = ClientRegistry(clock)
    hb = HeartbeatData.decode(CPP_PUSH)
    notes = reg.heartbeat(("h0", 1), hb, "CPP", 63)
    assert [(n.group, n.channels) for n in notes] == [("CG_TEST", (("h0", 1),))]
    assert reg.heartbeat(("h0", 1), hb, "CPP", 63) == []  # same heartbeat again: no rebalance
    other = HeartbeatData.decode(CPP_PUSH.replace(b"2912-", b"3000-"))
    notes = reg.heartbeat(("h1", 7), other)
    assert notes[0].channels == (("h0", 1), ("h1", 7))
    assert reg.consumer_ids("CG_TEST") == ["2912-127.0.0.1@DEFAULT", "3000-127.0.0.1@DEFAULT"]
    assert reg.subscription("CG_TEST", "TopicTest").tags_set == ["TagA", "TagB"]
    assert [n.channels for n in reg.channel_closed(("h0", 1))] == [(("h1", 7),)]
    assert reg.consumer_ids("CG_TEST") == ["3000-127.0.0.1@DEFAULT"]
    assert reg.unregister(("h1", 7), consumer_group="CG_TEST") == []
    assert reg.consumer_ids("CG_TEST") == []


def test_silent_clients_expire():
    clock = Clock()
    reg = ClientRegistry(clock, channel_expired_s=120)
    reg.heartbeat("a", HeartbeatData.decode(CPP_PUSH))
    reg.heartbeat("b", HeartbeatData.decode(CPP_PUSH.replace(b"2912-", b"1-")))
    clock.t += 100
    reg.heartbeat("b", HeartbeatData.decode(CPP_PUSH.replace(b"2912-", b"1-")))
    clock.t += 30
    notes = reg.scan_expired()
    assert [(n.group, n.channels) for n in notes] == [("CG_TEST", ("b",))]
    assert reg.consumer_ids("CG_TEST") == ["1-127.0.0.1@DEFAULT"]

"""Apache 4.9 ``broker.conf`` keys that rocketlake does not implement, decided key by key.

An Apache operator's file must load as it is, but a key that would change what the broker does
must never be dropped silently. So each key is either

* **ignored with a warning** (``harmless=None``): it tunes something rocketlake does not have or does
  its own way (JVM thread pools, Netty buffers, HA details it does its own way), and running
  without it changes no answer a client gets; or
* **refused unless it has its "off" value** (``harmless={...}``): turning it on asks for a feature we
  lack (DLedger, SQL92 filter bit maps…), and running without it would be a lie — so
  ``enableDLegerCommitLog=false`` is ignored but ``enableDLegerCommitLog=true`` is an error naming the key;
* **refused unless it names what rocketlake uses anyway** (:data:`IMPLIED_BY_SETTINGS`): a path or an
  address rocketlake derives from a declared setting (``storeCheckpoint`` must be
  ``<storePathRootDir>/checkpoint``, ``brokerIP2`` must be ``brokerIP1``); checked by
  :mod:`broker.server.settings.loading` once the declared settings are known.

``deleteWhen``/``fileReservedTime`` (in Apache's own sample ``conf/broker.conf``) are ignored with a
warning: rocketlake never deletes commitlog files — its lake keeps the history — so the setting has
nothing to act on; the warning says so.
"""

from __future__ import annotations

from dataclasses import dataclass

_THREADS = "a Java thread pool or queue size; rocketlake sizes its own processes (requestProcesses)"
_NETTY = "a Netty tuning knob; rocketlake's asyncio remoting server has no such setting"
_CLEAN = "rocketlake never deletes commitlog or consume queue files (the lake keeps the history)"
_MMAP = "a page-cache/mmap tuning knob of Java's MappedFile; rocketlake writes files directly"
_FLUSH = "a flush batching knob; rocketlake flushes every flushIntervalCommitLog/flushIntervalConsumeQueue ms"
_FAST_FAIL = "Java's send-queue fast failure; rocketlake has no bounded send queue"
_COMMERCIAL = "Apache's commercial statistics log (a log file, not part of any answer); rocketlake does not write it"


@dataclass(frozen=True)
class ApacheOnlyKey:
    reason: str
    harmless: frozenset[str] | None = None  # values (lower case, trimmed) that are ignored; None: any value

    def is_harmless(self, value: str) -> bool:
        return self.harmless is None or value.strip().lower() in self.harmless


def _off(reason: str, *values: str) -> ApacheOnlyKey:
    return ApacheOnlyKey(reason, frozenset(values))


APACHE_ONLY_KEYS: dict[str, ApacheOnlyKey] = {
    # identity, paths, HA
    "brokerIP2": ApacheOnlyKey("rocketlake's HA address is brokerIP1's (haListenPort on brokerIP1)"),
    "slaveReadEnable": _off("a master never tells consumers to pull from a slave (Apache's default, false); "
                            "a slave serves the pulls it gets", "false"),
    "rocketmqHome": ApacheOnlyKey("the Java distribution's home directory; rocketlake does not read it"),
    "brokerConfigPath": ApacheOnlyKey("the file is the one given with -c/--config"),
    "storePathCommitLog": ApacheOnlyKey("the commitlog always lives in <storePathRootDir>/commitlog"),
    "storeCheckpoint": ApacheOnlyKey("the checkpoint always lives in <storePathRootDir>/checkpoint"),
    "abortFile": ApacheOnlyKey("the abort file always lives in <storePathRootDir>/abort"),
    # file cleaning
    "deleteWhen": ApacheOnlyKey(_CLEAN),
    "fileReservedTime": ApacheOnlyKey(_CLEAN),
    "diskMaxUsedSpaceRatio": ApacheOnlyKey(_CLEAN),
    "cleanResourceInterval": ApacheOnlyKey(_CLEAN),
    "deleteCommitLogFilesInterval": ApacheOnlyKey(_CLEAN),
    "deleteConsumeQueueFilesInterval": ApacheOnlyKey(_CLEAN),
    "destroyMapedFileIntervalForcibly": ApacheOnlyKey(_CLEAN),
    "redeleteHangedFileInterval": ApacheOnlyKey(_CLEAN),
    "cleanFileForciblyEnable": ApacheOnlyKey(_CLEAN),
    # mmap, page cache, flush batching
    "transientStorePoolEnable": ApacheOnlyKey(_MMAP),
    "transientStorePoolSize": ApacheOnlyKey(_MMAP),
    "warmMapedFileEnable": ApacheOnlyKey(_MMAP),
    "flushLeastPagesWhenWarmMapedFile": ApacheOnlyKey(_MMAP),
    "osPageCacheBusyTimeOutMills": ApacheOnlyKey(_MMAP),
    "useReentrantLockWhenPutMessage": ApacheOnlyKey(_MMAP),
    "commitIntervalCommitLog": ApacheOnlyKey(_MMAP),
    "commitCommitLogLeastPages": ApacheOnlyKey(_MMAP),
    "commitCommitLogThoroughInterval": ApacheOnlyKey(_MMAP),
    "flushCommitLogLeastPages": ApacheOnlyKey(_FLUSH),
    "flushConsumeQueueLeastPages": ApacheOnlyKey(_FLUSH),
    "flushCommitLogThoroughInterval": ApacheOnlyKey(_FLUSH),
    "flushConsumeQueueThoroughInterval": ApacheOnlyKey(_FLUSH),
    "flushCommitLogTimed": ApacheOnlyKey(_FLUSH),
    "flushDelayOffsetInterval": ApacheOnlyKey(_FLUSH),
    "maxTransferBytesOnMessageInDisk": ApacheOnlyKey(
        "rocketlake reads every pull the same way: maxTransferBytesOnMessageInMemory bounds it"),
    "maxTransferCountOnMessageInDisk": ApacheOnlyKey(
        "rocketlake reads every pull the same way: maxTransferCountOnMessageInMemory bounds it"),
    # thread pools and queues
    **{key: ApacheOnlyKey(_THREADS) for key in (
        "sendMessageThreadPoolNums", "putMessageFutureThreadPoolNums", "pullMessageThreadPoolNums",
        "processReplyMessageThreadPoolNums", "queryMessageThreadPoolNums", "adminBrokerThreadPoolNums",
        "clientManageThreadPoolNums", "consumerManageThreadPoolNums", "heartbeatThreadPoolNums",
        "endTransactionThreadPoolNums", "sendThreadPoolQueueCapacity", "pullThreadPoolQueueCapacity",
        "replyThreadPoolQueueCapacity", "queryThreadPoolQueueCapacity", "clientManagerThreadPoolQueueCapacity",
        "consumerManagerThreadPoolQueueCapacity", "heartbeatThreadPoolQueueCapacity",
        "endTransactionPoolQueueCapacity")},
    # Netty
    **{key: ApacheOnlyKey(_NETTY) for key in (
        "serverWorkerThreads", "serverCallbackExecutorThreads", "serverSelectorThreads", "serverOnewaySemaphoreValue",
        "serverAsyncSemaphoreValue", "serverChannelMaxIdleTimeSeconds", "serverSocketSndBufSize",
        "serverSocketRcvBufSize", "serverPooledByteBufAllocatorEnable", "useEpollNativeSelector",
        "clientWorkerThreads", "clientCallbackExecutorThreads", "clientOnewaySemaphoreValue",
        "clientAsyncSemaphoreValue", "connectTimeoutMillis", "channelNotActiveInterval", "clientSocketSndBufSize",
        "clientSocketRcvBufSize", "clientPooledByteBufAllocatorEnable", "clientCloseSocketIfTimeout")},
    # TLS (TlsSystemConfig): tlsMode, tls.server.*, useTLS and tls.client.* are declared; these are not
    "tls.test.mode.enable": _off("rocketlake serves only the configured certificate (tls.server.certPath, "
                                 "tls.server.keyPath), never a throwaway self-signed one", "false"),
    "tls.config.file": _off("the tls.* settings are read from the broker's own config file, not from a "
                            "separate tls.properties", ""),
    "tls.server.authClient": ApacheOnlyKey(
        "rocketlake verifies every client certificate it asks for (tls.server.need.client.auth) against "
        "tls.server.trustCertPath, as Apache does with authClient=true: Python's TLS cannot accept one "
        "unverified"),
    # fast failure, statistics, misc tuning
    "brokerFastFailureEnable": ApacheOnlyKey(_FAST_FAIL),
    "waitTimeMillsInSendQueue": ApacheOnlyKey(_FAST_FAIL),
    "waitTimeMillsInPullQueue": ApacheOnlyKey(_FAST_FAIL),
    "waitTimeMillsInHeartbeatQueue": ApacheOnlyKey(_FAST_FAIL),
    "waitTimeMillsInTransactionQueue": ApacheOnlyKey(_FAST_FAIL),
    "startAcceptSendRequestTimeStamp": ApacheOnlyKey(_FAST_FAIL),
    "traceOn": ApacheOnlyKey(_COMMERCIAL),
    "commercialBaseCount": ApacheOnlyKey(_COMMERCIAL),
    "transferMsgByHeap": ApacheOnlyKey("how Java copies pulled messages; rocketlake always copies them once"),
    "registerBrokerTimeoutMills": ApacheOnlyKey("rocketlake registers with a 3 s timeout per name server"),
    "compressedRegister": ApacheOnlyKey("rocketlake always registers uncompressed (the name server reads both)"),
    "forceRegister": ApacheOnlyKey("rocketlake always sends the full topic table when it registers"),
    "notifyConsumerIdsChangedEnable": _off("rocketlake always notifies consumers of group changes", "true"),
    "clusterTopicEnable": _off("the cluster-name topic is always created", "true"),
    "brokerTopicEnable": _off("the broker-name topic is always created", "true"),
    "duplicationEnable": _off("commitlog duplication (for DLedger migration) is not implemented", "false"),
    # features we lack: refused unless off
    "enableDLegerCommitLog": _off("DLedger (Raft) commitlog replication is not implemented", "false"),
    "dLegerGroup": _off("DLedger (Raft) commitlog replication is not implemented", ""),
    "dLegerPeers": _off("DLedger (Raft) commitlog replication is not implemented", ""),
    "dLegerSelfId": _off("DLedger (Raft) commitlog replication is not implemented", ""),
    "enableCalcFilterBitMap": _off("SQL92 filter bit maps are not implemented", "false"),
    "enableConsumeQueueExt": _off("the consume queue extension file is not written", "false"),
    "filterServerNums": _off("filter servers are not implemented", "0"),
    "traceTopicEnable": _off("the message trace topic RMQ_SYS_TRACE_TOPIC is not created", "false"),
    "msgTraceTopicName": _off("the message trace topic is not created", "rmq_sys_trace_topic"),
    "messageStorePlugIn": _off("message store plug-ins are Java classes", ""),
    "brokerPermission": _off("the broker is always readable and writable (perm 6)", "6"),
    "fetchNamesrvAddrByAddressServer": _off("name server addresses come from namesrvAddr only", "false"),
    "highSpeedMode": _off("high speed mode is not implemented", "false"),
    "autoDeleteUnusedStats": _off("rocketlake keeps the statistics of every topic and group it has seen "
                                  "(Apache's default, false)", "false"),
}

# Keys harmless only with the value rocketlake uses anyway, derived from the declared settings: a
# store path (relative to storePathRootDir; an absolute path) or a declared setting's value.
STORE_PATH = "path"
SETTING = "setting"
IMPLIED_BY_SETTINGS: dict[str, tuple[str, str]] = {
    "storePathCommitLog": (STORE_PATH, "commitlog"),
    "storeCheckpoint": (STORE_PATH, "checkpoint"),
    "abortFile": (STORE_PATH, "abort"),
    "brokerIP2": (SETTING, "broker_ip1"),
}

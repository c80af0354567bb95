"""The trainer client's consumer settings (``hintstream.client.consumer_settings``)."""

from hintstream.client import FETCH_QUEUE_BACKOFF_MS, PARTITION_FETCH_BYTES, consumer_settings, partition_fetch_bytes
from vectors import shared_vectors


def never(err):
    raise AssertionError(err)


def test_a_partition_is_fetched_16_mib_at_a_time_unless_the_user_sets_it():
    own = consumer_settings({"bootstrap.servers": "b:9092"}, None, never)
    assert own["max.partition.fetch.bytes"] == PARTITION_FETCH_BYTES == 16 << 20
    assert own["fetch.wait.max.ms"] == 100
    # A full prefetch queue pauses fetching 10 ms, as the worker's readers do.
    assert own["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS == 10
    assert consumer_settings({}, {"fetch.queue.backoff.ms": 500}, never)["fetch.queue.backoff.ms"] == 500
    # The user's, from either config, under this name.
    assert consumer_settings({"max.partition.fetch.bytes": 1}, None, never)["max.partition.fetch.bytes"] == 1
    assert consumer_settings({}, {"max.partition.fetch.bytes": 2}, never)["max.partition.fetch.bytes"] == 2
    # consumer_config over config.
    assert consumer_settings({"max.partition.fetch.bytes": 1}, {"max.partition.fetch.bytes": 2}, never)["max.partition.fetch.bytes"] == 2
    # A quarter of a queue the user sets, within 1 MiB and 16 MiB.
    assert partition_fetch_bytes() == 16 << 20
    assert partition_fetch_bytes(32768) == 8 << 20
    assert partition_fetch_bytes("4096") == 1 << 20
    assert partition_fetch_bytes(2_000_000) == 16 << 20
    assert consumer_settings({}, {"queued.max.messages.kbytes": 8192}, never)["max.partition.fetch.bytes"] == 2 << 20
    # Under librdkafka's other name: ours is left out, so only theirs reaches librdkafka.
    for base, extra in (({"fetch.message.max.bytes": 3}, None), ({}, {"fetch.message.max.bytes": 3})):
        settings = consumer_settings(base, extra, never)
        assert "max.partition.fetch.bytes" not in settings
        assert settings["fetch.message.max.bytes"] == 3


def test_the_settings_reads_rest_on_are_not_the_users_to_change():
    settings = consumer_settings(
        {"isolation.level": "read_uncommitted"},
        {"enable.auto.commit": True, "auto.offset.reset": "earliest"},
        never,
    )
    assert settings["isolation.level"] == "read_committed"
    assert settings["enable.auto.commit"] is False
    assert settings["enable.auto.offset.store"] is False
    assert settings["enable.partition.eof"] is False
    assert settings["error_cb"] is never
    # A default of the client's own is the user's to change.
    assert settings["auto.offset.reset"] == "earliest"
    assert settings["group.id"].startswith("hintstream-trainer-")


def test_a_partitions_fetch_matches_the_shared_vectors():
    """The vectors both languages read (``schemas/vectors/fetch.json``;
    the worker's readers in ``src/kafka/settings.rs``), given in
    ``consumer_config``."""
    cases = shared_vectors("fetch.json")["cases"]
    assert len(cases) >= 10
    for case in cases:
        settings = consumer_settings({"bootstrap.servers": "b:9092"}, case["given"], never)
        assert settings.get("max.partition.fetch.bytes") == case["max.partition.fetch.bytes"], case["case"]

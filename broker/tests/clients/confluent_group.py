"""confluent-kafka (librdkafka) as a Kafka user runs it, for broker/tests/groups.rs.

  produce BOOTSTRAP TOPIC COUNT          values "0".."COUNT-1", default producer settings
  consume BOOTSTRAP TOPIC GROUP OUT      a group consumer with default settings (but a 6 s
                                         session); appends "partition offset value" per record
                                         to OUT, flushed per poll; SIGTERM closes it cleanly
                                         (which commits)
  committed BOOTSTRAP TOPIC GROUP N      prints the group's committed offsets of partitions
                                         0..N-1 as JSON {"0": offset, ...}
"""

import json
import signal
import sys

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def produce(bootstrap, topic, count):
    failures = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    # Records spread over every partition: the sticky partitioner (librdkafka's default) fills
    # one partition for 10 ms at a time, so a fast run leaves some nearly empty and a member
    # assigned only those never gets going.
    p = Producer({"bootstrap.servers": bootstrap, "sticky.partitioning.linger.ms": 0})
    for i in range(int(count)):
        while True:
            try:
                p.produce(topic, str(i).encode(), on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    left = p.flush(60)
    if left or failures:
        sys.exit(f"{left} records undelivered, {len(failures)} failed: {failures[:3]}")


def consume(bootstrap, topic, group, out):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    c.subscribe([topic])
    with open(out, "a") as f:
        while not stop:
            for m in c.consume(num_messages=1000, timeout=0.2):
                if m.error() is None:
                    f.write(f"{m.partition()} {m.offset()} {m.value().decode()}\n")
            f.flush()
    c.close()


def committed(bootstrap, topic, group, n):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(int(n))], timeout=20)
    except KafkaException as e:
        sys.exit(f"committed() failed: {e}")
    c.close()
    print(json.dumps({str(tp.partition): tp.offset for tp in tps}))


if __name__ == "__main__":
    {"produce": produce, "consume": consume, "committed": committed}[sys.argv[1]](*sys.argv[2:])

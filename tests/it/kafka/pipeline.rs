//! The consume loop's pipeline (`Stage::PIPELINED`, stage 2's), on Apache
//! Kafka: messages are decoded side by side and handed to the stage in
//! partition order; and one still in the pipeline when its partition is
//! revoked is dropped (abandoned, redone by the new owner), not handed on,
//! so the revoke's drain does not wait for it and no stage parks it.

use super::revoke::{stage_loop, start_acking, wait_assigned};
use crate::common;
use crate::common::waits::wait_count;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hintstream::kafka::pipeline::{BATCH_BYTES, TASK_BYTES};
use hintstream::kafka::{Partition, RecordMeta, Rejected, Stage, Taken, Work};
use hintstream::metrics::StageMetrics;

/// Records the order it is handed messages in, and how many decodes ran
/// at once. A large message's decode sleeps (the first of a wave's two
/// longer, so that the second's ends first); a small one's is at once.
#[derive(Default)]
struct RecordsOrder {
    decoding: AtomicUsize,
    most_at_once: AtomicUsize,
    handed: Mutex<Vec<(i32, i64)>>,
}

impl Stage for RecordsOrder {
    type Input = ();
    const PIPELINED: bool = true;

    fn decode(&self, payload: &bytes::Bytes, _: &RecordMeta) -> Result<(), Rejected> {
        let sleep = match payload.first() {
            Some(b'a') => 60,
            Some(b'b') => 15,
            _ => return Ok(()),
        };
        let now = self.decoding.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(sleep));
        self.decoding.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    fn handle(self: &Arc<Self>, work: Work<()>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let meta = work.message.meta();
        self.handed.lock().unwrap().push((meta.partition, meta.offset));
        work.message.ack();
        async {}
    }
}

/// Produces `payloads` to `partition` of `topic`, in order.
async fn produce_wave(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    partition: i32,
    payloads: &[&[u8]],
) {
    for payload in payloads {
        common::send_to_partition(producer, topic, partition, payload).await;
    }
}

/// Waves of messages on one partition: two large ones (each a batch of its
/// own, decoded side by side, the second done first) and two small ones
/// (a batch decoded on the loop, sent behind them); and, every third
/// wave, once everything before was handed on, small ones alone (handed on
/// by the loop itself). The stage sees them all in offset order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pipelined_stage_decodes_side_by_side_and_is_handed_its_messages_in_order() {
    const WAVES: usize = 9;
    let broker = common::shared_kafka();
    let config = common::config_for(&broker.bootstrap);
    let topic = common::unique("pipeline-order");
    common::create_topics(&config, &[&topic, &format!("{topic}.dlq")], 1).await;
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    let stage = Arc::new(RecordsOrder::default());
    let metrics = Arc::new(StageMetrics::unregistered());
    let group = common::unique("pipeline-order-group");
    let stage_loop = stage_loop(&config, &group, &topic, metrics.clone(), Duration::from_secs(20));
    let running_stage = stage.clone();
    let running = common::spawn_stage(move |stop| stage_loop.run_stage(running_stage, stop));
    let large = |first: u8| {
        let mut payload = vec![first; BATCH_BYTES + 1];
        payload[1] = b'x';
        payload
    };
    let (first, second, small) = (large(b'a'), large(b'b'), b"s".to_vec());
    let mut sent = 0;
    for wave in 0..WAVES {
        if wave % 3 == 2 {
            let handed = || stage.handed.lock().unwrap().len();
            wait_count("handed on", sent, Duration::from_secs(30), handed).await;
            produce_wave(&producer, &topic, 0, &[&small, &small, &small]).await;
            sent += 3;
        } else {
            produce_wave(&producer, &topic, 0, &[&first, &second, &small, &small]).await;
            sent += 4;
        }
        wait_count("taken", sent, Duration::from_secs(30), || {
            metrics.received_count() as usize
        })
        .await;
    }
    common::waits::wait_committed_to_end(&config, &group, &topic, 1, Duration::from_secs(60), || {
        format!("handed: {:?}", stage.handed.lock().unwrap())
    })
    .await;
    running.stop().await;
    let handed: Vec<i64> = stage.handed.lock().unwrap().iter().map(|(_, o)| *o).collect();
    let in_order: Vec<i64> = (0..sent as i64).collect();
    assert_eq!(handed, in_order, "handed out of offset order");
    let most = stage.most_at_once.load(Ordering::SeqCst);
    eprintln!("{sent} messages, at most {most} decoded at once");
    assert!(most >= 2, "the decodes ran one at a time");
}

/// Parks every message it is handed (it never acknowledges one), as stage 2
/// parks the rows of incomplete steps, and releases the revoked
/// partitions' ones on a revoke. It does not check for a revoke itself:
/// what it is handed after one is the pipeline's to drop. Its first decode
/// waits until the first revoke begins, and the messages taken after it
/// wait behind it, so that they are still in the pipeline then.
struct ParksAfterTheRevoke {
    waited: AtomicBool,
    revoked: Mutex<Option<BTreeSet<i32>>>,
    begun: Condvar,
    parked: Mutex<Vec<Taken>>,
}

impl Stage for ParksAfterTheRevoke {
    type Input = ();
    const PIPELINED: bool = true;

    fn decode(&self, _: &bytes::Bytes, _: &RecordMeta) -> Result<(), Rejected> {
        if self.waited.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let revoked = self.revoked.lock().unwrap();
        let (revoked, waited) = self
            .begun
            .wait_timeout_while(revoked, Duration::from_secs(60), |r| r.is_none())
            .unwrap();
        drop(revoked);
        assert!(!waited.timed_out(), "no revoke within 60 s");
        Ok(())
    }

    fn handle(self: &Arc<Self>, work: Work<()>) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.parked.lock().unwrap().push(work.message);
        async {}
    }

    fn on_revoke(&self, partitions: &[Partition]) -> usize {
        let numbers: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let released: Vec<Taken> = {
            let mut parked = self.parked.lock().unwrap();
            let (go, stay) = std::mem::take(&mut *parked)
                .into_iter()
                .partition(|t| numbers.contains(&t.meta().partition));
            *parked = stay;
            go
        };
        let mut revoked = self.revoked.lock().unwrap();
        revoked.get_or_insert_with(BTreeSet::new).extend(numbers);
        self.begun.notify_all();
        released.len()
    }
}

// Eight workers: the ordered task then takes up to 16 batches unhanded
// (`pipeline::depth`) before the loop waits for it, as many as there are
// messages, so the loop, free to poll, takes part in the rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn messages_of_a_revoked_partition_still_in_the_pipeline_are_abandoned_not_handed_on() {
    const PARTITIONS: i32 = 4;
    const MESSAGES: usize = 16;
    const DRAIN: Duration = Duration::from_secs(30);
    let broker = common::shared_kafka();
    let mut config = common::config_for(&broker.bootstrap);
    config.kafka.insert("session.timeout.ms", "10000");
    config.kafka.insert("heartbeat.interval.ms", "500");
    let topic = common::unique("pipeline-revoke");
    common::create_topics(&config, &[&topic, &format!("{topic}.dlq")], PARTITIONS).await;
    let producer = hintstream::kafka::create_producer(&config).unwrap();
    // Each large enough to be decoded in a task (a small one, with nothing
    // on its way, would be decoded on the loop, which its wait would block).
    let payload = vec![b'x'; TASK_BYTES];
    for i in 0..MESSAGES {
        common::send(&producer, &topic, &format!("k{i}"), &payload).await;
    }
    let group = common::unique("pipeline-revoke-group");
    let a = Arc::new(ParksAfterTheRevoke {
        waited: AtomicBool::new(false),
        revoked: Mutex::new(None),
        begun: Condvar::new(),
        parked: Mutex::default(),
    });
    let a_metrics = Arc::new(StageMetrics::unregistered());
    let a_loop = stage_loop(&config, &group, &topic, a_metrics.clone(), DRAIN);
    let a_stage = a.clone();
    let a_running = common::spawn_stage(move |stop| a_loop.run_stage(a_stage, stop));
    // Every message taken (and waiting in its decode) before B joins.
    wait_count("A took", MESSAGES, Duration::from_secs(60), || {
        a_metrics.in_flight()
    })
    .await;
    // B acknowledges what it gets.
    let (b_running, b_metrics, b_seen) = start_acking(&config, &group, &topic, DRAIN);
    let took = wait_assigned(&b_metrics, |n| n > 0, DRAIN + Duration::from_secs(30)).await;
    eprintln!("B assigned after {took:.1?} (drain timeout {DRAIN:?})");
    assert!(
        took < DRAIN / 2,
        "the rebalance waited {took:?}, as if for the revoked partitions' messages in the pipeline"
    );
    // A is left with what it parked: the messages of the partitions it kept.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (parked, gone) = (
            a.parked.lock().unwrap().len(),
            a_metrics.abandoned_count() as usize,
        );
        if parked + gone >= MESSAGES {
            break;
        }
        assert!(Instant::now() < deadline, "A parked {parked}, abandoned {gone}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let revoked = a.revoked.lock().unwrap().clone().unwrap();
    let stray: Vec<i32> = a
        .parked
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.meta().partition)
        .filter(|p| revoked.contains(p))
        .collect();
    assert!(
        stray.is_empty(),
        "A parked messages of partitions revoked from it ({revoked:?}): {stray:?}"
    );
    let abandoned = a_metrics.abandoned_count() as usize;
    assert!(abandoned > 0, "no message of {revoked:?} was in the pipeline");
    // B redoes every one of them.
    wait_count("B got", abandoned, Duration::from_secs(30), || {
        b_seen.lock().unwrap().len()
    })
    .await;
    let b_partitions: BTreeSet<i32> = b_seen.lock().unwrap().iter().copied().collect();
    assert!(
        b_partitions.is_subset(&revoked),
        "B: {b_partitions:?}, revoked: {revoked:?}"
    );
    a_running.stop().await;
    b_running.stop().await;
}

//! The endpoint's connection slots: at most `max` connections are served at
//! once. Under the cap a new connection takes a free slot at once. At the cap
//! it takes one only once its request's first bytes are in its socket: then
//! the connection that has moved no byte for longest loses its slot and is
//! closed (one whose own request waits unread is passed over while another
//! can go). Until its request comes it waits unserved for that or a free
//! slot, up to its header deadline. At most `max` wait: a newer one takes the
//! place of the one waiting longest, which is closed (unless its request, or
//! a free slot, came first). A free slot goes to whichever asks first, a
//! newcomer or a waiter woken by the slot's release.
//!
//! Why evict rather than refuse: a probe cannot be told from any other
//! client before its request is read, so a slot reserve for probes fills
//! with idle connections the same way the cap does. Evicting the least
//! recently active connection gives every client that sends a request a
//! slot, and the connections that lose theirs are those that send nothing:
//! a liveness probe sends its request as soon as it connects, so idle
//! connections, however many, cannot keep it out. Its bytes count from when
//! they reach its socket, not from when its task reads them (on a busy
//! machine that task is polled late).
//!
//! Why a newcomer waits for its request before it evicts: idle clients that
//! reconnect as soon as they are closed would otherwise close one another in
//! turn, every slot turned over in milliseconds, and a probe whose request
//! came a few milliseconds after its connection (its thread descheduled)
//! lost its slot before the request arrived. A newcomer that sends nothing
//! takes no one's slot, so one eviction does not lead to the next. Waiters
//! make room for one another the other way round (the one waiting longest
//! goes, not a newcomer): idle connections opened by the hundred, and not
//! opened again, cannot keep a probe waiting; ones opened again as soon as
//! they are closed turn the waiters over as they once turned the slots, but
//! only past twice `max` of them.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::idle::Activity;

/// The slots of one endpoint; shared by its accept loop and its
/// connections.
pub(super) struct Slots {
    max: usize,
    held: Mutex<Held>,
    /// Told whenever a slot frees, for the newcomers waiting at the cap.
    freed: Notify,
}

#[derive(Default)]
struct Held {
    next: u64,
    by_id: HashMap<u64, Holder>,
    /// Newcomers waiting at the cap for their request or a free slot, by
    /// when they came (their ids are slot ids not given to holders), each
    /// with how to tell it that a newer one took its place.
    waiting: BTreeMap<u64, CancellationToken>,
}

/// Why a newcomer got no slot; it is closed unanswered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// It waited longest of `max` waiting when another came, its request
    /// still not in.
    Displaced,
    /// Its request did not come, nor a slot free, by its deadline.
    Late,
    /// It closed (or its socket failed) before sending a request.
    Gone,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Displaced => {
                "it waited longest at the connection cap, its request not in, when a newer connection came"
            }
            Refused::Late => "no request and no free slot by its header deadline",
            Refused::Gone => "closed before sending a request",
        })
    }
}

/// Where a newcomer stands once it arrived ([`Slots::arrive`]).
pub(super) enum Arrival {
    /// It holds a slot; `true` when another lost it.
    Admitted(Slot, bool),
    /// At the cap, its request not in yet: it waits ([`Waiter::admitted`]).
    Waits(Waiter),
}

/// A newcomer waiting at the cap for its request or a free slot.
pub(super) struct Waiter {
    counted: Counted,
    activity: Activity,
    unread: Option<Unread>,
    deadline: Instant,
    /// Fires when a newer newcomer took its place among those waiting.
    displaced: CancellationToken,
}

/// A newcomer counted among those waiting at `slots` (under its id), until
/// dropped.
struct Counted {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.slots.held().waiting.remove(&self.id);
    }
}

/// A connection holding a slot: when it last moved a byte, whether bytes
/// wait in its socket, and how to tell it to close.
struct Holder {
    activity: Activity,
    unread: Option<Unread>,
    evict: CancellationToken,
}

impl Holder {
    fn has_unread(&self) -> bool {
        self.unread.as_ref().is_some_and(Unread::waiting)
    }
}

/// A second handle on a connection's socket, only to ask whether bytes wait
/// in it unread. Held in the connection's slot, so it is closed with the
/// slot, before the connection's own handle ([`Slot`]'s drop comes first):
/// the peer sees the close when the connection ends.
pub(super) struct Unread(std::net::TcpStream);

impl Unread {
    /// `stream` again, and the second handle on its socket; none when no
    /// file descriptor is left for it (the connection is served all the
    /// same, only never passed over). An error only when `stream` cannot
    /// be registered with the runtime again.
    pub(super) fn of(stream: tokio::net::TcpStream) -> io::Result<(tokio::net::TcpStream, Option<Unread>)> {
        let stream = stream.into_std()?;
        let second = stream.try_clone().ok().map(Unread);
        Ok((tokio::net::TcpStream::from_std(stream)?, second))
    }

    /// Whether bytes wait to be read (the socket is non-blocking: tokio's).
    fn waiting(&self) -> bool {
        matches!(self.0.peek(&mut [0u8; 1]), Ok(n) if n > 0)
    }
}

/// One connection's slot, freed when dropped.
pub(super) struct Slot {
    id: u64,
    slots: Arc<Slots>,
    evicted: CancellationToken,
}

impl Slots {
    /// Slots for `max` connections (at least one).
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(Slots {
            max: max.max(1),
            held: Mutex::new(Held::default()),
            freed: Notify::new(),
        })
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Every change completes before the lock is released.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A newcomer whose bytes `activity` follows arrives (see
    /// [`Slots::admit`]): it takes a free slot at once, or another's when
    /// its request is in its socket already; else, at the cap, it waits
    /// until `deadline`. At most `max` wait: the one waiting longest makes
    /// room for it (that one is refused, [`Refused::Displaced`], unless its
    /// request is in by then). Called in the order connections are
    /// accepted, so that free slots are taken in that order.
    pub(super) fn arrive(
        self: &Arc<Self>,
        activity: Activity,
        unread: Option<Unread>,
        deadline: Instant,
    ) -> Arrival {
        let mut held = self.held();
        if held.by_id.len() < self.max || unread.as_ref().is_some_and(Unread::waiting) {
            let (slot, evicted) = self.take(&mut held, activity, unread);
            return Arrival::Admitted(slot, evicted);
        }
        while held.waiting.len() >= self.max {
            if let Some((_, displaced)) = held.waiting.pop_first() {
                displaced.cancel();
            }
        }
        let id = held.next;
        held.next += 1;
        let displaced = CancellationToken::new();
        held.waiting.insert(id, displaced.clone());
        Arrival::Waits(Waiter {
            counted: Counted {
                slots: self.clone(),
                id,
            },
            activity,
            unread,
            deadline,
            displaced,
        })
    }

    /// A slot for this connection if one is free; else its parts back.
    fn take_free(
        self: &Arc<Self>,
        activity: Activity,
        unread: Option<Unread>,
    ) -> Result<Slot, (Activity, Option<Unread>)> {
        let mut held = self.held();
        if held.by_id.len() < self.max {
            Ok(self.take(&mut held, activity, unread).0)
        } else {
            Err((activity, unread))
        }
    }

    /// Takes a slot for a connection whose bytes `activity` follows (and,
    /// with `unread`, whose socket can be asked for bytes not read yet).
    /// With every slot held, the holder that moved no byte for longest and
    /// has none waiting loses its slot first (its [`Slot::evicted`] fires;
    /// when every holder has bytes waiting, the one idle longest); returns
    /// whether one did.
    fn admit(self: &Arc<Self>, activity: Activity, unread: Option<Unread>) -> (Slot, bool) {
        self.take(&mut self.held(), activity, unread)
    }

    /// [`Slots::admit`] under the lock.
    fn take(self: &Arc<Self>, held: &mut Held, activity: Activity, unread: Option<Unread>) -> (Slot, bool) {
        let mut evicted = false;
        while held.by_id.len() >= self.max {
            let Some(oldest) = held.least_active() else {
                break;
            };
            if let Some(holder) = held.by_id.remove(&oldest) {
                holder.evict.cancel();
                evicted = true;
            }
        }
        let id = held.next;
        held.next += 1;
        let token = CancellationToken::new();
        held.by_id.insert(
            id,
            Holder {
                activity,
                unread,
                evict: token.clone(),
            },
        );
        (
            Slot {
                id,
                slots: self.clone(),
                evicted: token,
            },
            evicted,
        )
    }

    /// Connections holding a slot now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held().by_id.len()
    }
}

impl Held {
    /// The holder to evict: idle longest among those with no bytes waiting
    /// (every one is asked only when the idlest have some), else idle
    /// longest.
    fn least_active(&self) -> Option<u64> {
        // Each holder's time read once: its connection moves bytes on
        // another thread meanwhile, and a sort whose keys change under it
        // panics ("does not correctly implement a total order"; seen in
        // `healthz_and_readyz_answer_while_idle_connections_hold_every_slot`).
        let mut by_idle: Vec<(Instant, u64, &Holder)> = self
            .by_id
            .iter()
            .map(|(&id, h)| (h.activity.last_active(), id, h))
            .collect();
        by_idle.sort_by_key(|&(last_active, ..)| last_active);
        by_idle
            .iter()
            .find(|(.., h)| !h.has_unread())
            .or(by_idle.first())
            .map(|&(_, id, _)| id)
    }
}

impl Waiter {
    /// Waits for this newcomer's request on `stream` (then the holder idle
    /// longest makes room, [`Slots::admit`]) or a free slot, until its
    /// deadline. Returns its slot and whether another lost it.
    pub(super) async fn admitted(self, stream: &TcpStream) -> Result<(Slot, bool), Refused> {
        // `counted` lives to the end: the newcomer is counted among those
        // waiting until it has a slot or is refused.
        let Waiter {
            counted,
            activity,
            unread,
            deadline,
            displaced,
        } = self;
        let slots = &counted.slots;
        let mut parts = (activity, unread);
        loop {
            // Enabled before the slots are read, so that a slot freed
            // after the read wakes this newcomer.
            let freed = slots.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match slots.take_free(parts.0, parts.1) {
                Ok(slot) => return Ok((slot, false)),
                Err(back) => parts = back,
            }
            let mut first = [0u8; 1];
            // Its request first: one that came as it was displaced or its
            // deadline passed still takes a slot.
            tokio::select! {
                biased;
                peeked = stream.peek(&mut first) => return match peeked {
                    Ok(n) if n > 0 => Ok(slots.admit(parts.0, parts.1)),
                    _ => Err(Refused::Gone),
                },
                () = &mut freed => {}
                () = displaced.cancelled() => return Err(Refused::Displaced),
                () = tokio::time::sleep_until(deadline) => return Err(Refused::Late),
            }
        }
    }
}

impl Slot {
    /// Resolves once this connection lost its slot to a newer one.
    pub(super) async fn evicted(&self) {
        self.evicted.cancelled().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let freed = self.slots.held().by_id.remove(&self.id).is_some();
        if freed {
            self.slots.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::idle::Tracked;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_at_the_cap_evicts_the_connection_idle_longest() {
        let slots = Slots::new(3);
        let mut clients = Vec::new();
        let mut admitted = Vec::new();
        for _ in 0..3 {
            let (client, server) = tokio::io::duplex(64);
            let (tracked, activity) = Tracked::new(server);
            let (slot, evicted) = slots.admit(activity, None);
            assert!(!evicted);
            clients.push(client);
            admitted.push((slot, tracked));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // The first moves a byte now: the second is idle longest.
        let (slot, mut tracked) = admitted.remove(0);
        tracked.write_all(b"x").await.unwrap();
        admitted.insert(0, (slot, tracked));
        let (_, activity) = Tracked::new(tokio::io::duplex(64).1);
        let (newcomer, evicted) = slots.admit(activity, None);
        assert!(evicted);
        assert_eq!(slots.len(), 3);
        let fired = |i: usize| admitted[i].0.evicted.is_cancelled();
        assert_eq!((fired(0), fired(1), fired(2)), (false, true, false));
        // A slot freed by its connection's end is taken without eviction.
        drop(admitted.remove(2));
        let (_, activity) = Tracked::new(tokio::io::duplex(64).1);
        let (_another, evicted) = slots.admit(activity, None);
        assert!(!evicted);
        assert!(!newcomer.evicted.is_cancelled());
        assert_eq!(slots.len(), 3);
    }

    /// `n` loopback connections admitted to `slots` in turn, each its
    /// client, its slot and its served end (never read).
    async fn tcp_holders(
        slots: &Arc<Slots>,
        n: usize,
    ) -> Vec<(tokio::net::TcpStream, Slot, Tracked<tokio::net::TcpStream>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut holders = Vec::new();
        for _ in 0..n {
            let client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let (server, unread) = Unread::of(server).unwrap();
            let (tracked, activity) = Tracked::new(server);
            let (slot, _) = slots.admit(activity, unread);
            holders.push((client, slot, tracked));
            // Each idle a little longer than the next.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        holders
    }

    /// Sends a request from a holder's client and waits until it is in the
    /// socket of its served end (nothing reads it).
    async fn send_unread(holder: &mut (tokio::net::TcpStream, Slot, Tracked<TcpStream>)) {
        holder
            .0
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), holder.2.get_ref().peek(&mut [0u8; 1]))
            .await
            .expect("the request reached the socket")
            .unwrap();
    }

    /// A loopback connection not admitted yet: its client, and its served
    /// end with the activity and second handle [`Slots::arrive`] takes.
    async fn newcomer() -> (
        tokio::net::TcpStream,
        Tracked<TcpStream>,
        Activity,
        Option<Unread>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (server, unread) = Unread::of(server).unwrap();
        let (tracked, activity) = Tracked::new(server);
        (client, tracked, activity, unread)
    }

    fn in_a_minute() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// [`Slots::arrive`], then the wait of one that waits.
    async fn enter(
        slots: &Arc<Slots>,
        stream: &TcpStream,
        activity: Activity,
        unread: Option<Unread>,
        deadline: Instant,
    ) -> Result<(Slot, bool), Refused> {
        match slots.arrive(activity, unread, deadline) {
            Arrival::Admitted(slot, evicted) => Ok((slot, evicted)),
            Arrival::Waits(waiter) => waiter.admitted(stream).await,
        }
    }

    #[tokio::test]
    async fn at_the_cap_a_newcomer_takes_no_slot_until_its_request_comes() {
        let slots = Slots::new(2);
        let holders = tcp_holders(&slots, 2).await;
        let (mut client, tracked, activity, unread) = newcomer().await;
        let entering = enter(&slots, tracked.get_ref(), activity, unread, in_a_minute());
        tokio::pin!(entering);
        // It sends nothing: it waits, and no one loses a slot.
        assert!(futures::poll!(entering.as_mut()).is_pending());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(futures::poll!(entering.as_mut()).is_pending());
        assert!(holders.iter().all(|h| !h.1.evicted.is_cancelled()));
        assert_eq!(slots.held().waiting.len(), 1);
        // Its request comes: the holder idle longest makes room.
        client.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await.unwrap();
        let (_slot, evicted) = tokio::time::timeout(Duration::from_secs(10), entering)
            .await
            .expect("admitted once its request came")
            .unwrap();
        assert!(evicted);
        let fired: Vec<bool> = holders.iter().map(|h| h.1.evicted.is_cancelled()).collect();
        assert_eq!(fired, [true, false]);
        assert_eq!((slots.len(), slots.held().waiting.len()), (2, 0));
    }

    #[tokio::test]
    async fn a_newcomer_waiting_at_the_cap_takes_the_next_slot_freed() {
        let slots = Slots::new(2);
        let mut holders = tcp_holders(&slots, 2).await;
        let (_client, tracked, activity, unread) = newcomer().await;
        let entering = enter(&slots, tracked.get_ref(), activity, unread, in_a_minute());
        tokio::pin!(entering);
        assert!(futures::poll!(entering.as_mut()).is_pending());
        drop(holders.pop());
        let (_slot, evicted) = tokio::time::timeout(Duration::from_secs(10), entering)
            .await
            .expect("admitted once a slot freed")
            .unwrap();
        assert!(!evicted);
        assert!(!holders[0].1.evicted.is_cancelled());
        assert_eq!(slots.len(), 2);
    }

    #[tokio::test]
    async fn past_the_waiting_bound_the_one_waiting_longest_makes_room_unless_its_request_came() {
        let slots = Slots::new(1);
        let holders = tcp_holders(&slots, 1).await;
        let (_first_client, first, activity, unread) = newcomer().await;
        let first = enter(&slots, first.get_ref(), activity, unread, in_a_minute());
        tokio::pin!(first);
        assert!(futures::poll!(first.as_mut()).is_pending());
        let (mut second_client, second_end, activity, unread) = newcomer().await;
        let second = enter(&slots, second_end.get_ref(), activity, unread, in_a_minute());
        tokio::pin!(second);
        assert!(futures::poll!(second.as_mut()).is_pending());
        // At most as many wait as the cap, one: the first made room.
        let first = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .unwrap();
        assert_eq!(first.err(), Some(Refused::Displaced));
        assert_eq!(slots.held().waiting.len(), 1);
        // The second's request is in its socket; before its task looks, a
        // third comes and displaces it: its request counts first.
        second_client
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        second_end.get_ref().peek(&mut [0u8; 1]).await.unwrap();
        let (_third_client, third_end, activity, unread) = newcomer().await;
        let third = enter(&slots, third_end.get_ref(), activity, unread, in_a_minute());
        tokio::pin!(third);
        assert!(futures::poll!(third.as_mut()).is_pending());
        let (_slot, evicted) = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .unwrap()
            .expect("its request came before it was told it was displaced");
        assert!(evicted && holders[0].1.evicted.is_cancelled());
        assert!(futures::poll!(third.as_mut()).is_pending());
        assert_eq!((slots.len(), slots.held().waiting.len()), (1, 1));
    }

    #[tokio::test]
    async fn a_waiter_whose_client_goes_or_whose_deadline_passes_is_refused() {
        let slots = Slots::new(1);
        let _holders = tcp_holders(&slots, 1).await;
        let (client, tracked, activity, unread) = newcomer().await;
        let waiting = enter(&slots, tracked.get_ref(), activity, unread, in_a_minute());
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(client);
        let gone = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap();
        assert_eq!(gone.err(), Some(Refused::Gone));
        assert!(slots.held().waiting.is_empty());
        let (_client, tracked, activity, unread) = newcomer().await;
        let deadline = Instant::now() + Duration::from_millis(100);
        let late = enter(&slots, tracked.get_ref(), activity, unread, deadline).await;
        assert_eq!(late.err(), Some(Refused::Late));
        assert!(Instant::now() >= deadline);
        assert_eq!((slots.len(), slots.held().waiting.len()), (1, 0));
    }

    #[tokio::test]
    async fn a_connection_whose_request_waits_unread_is_passed_over() {
        let slots = Slots::new(3);
        let mut holders = tcp_holders(&slots, 3).await;
        // The idlest has sent its request; no task has read it yet.
        send_unread(&mut holders[0]).await;
        let (_, activity) = Tracked::new(tokio::io::duplex(64).1);
        let (_newcomer, evicted) = slots.admit(activity, None);
        assert!(evicted);
        let fired: Vec<bool> = holders.iter().map(|h| h.1.evicted.is_cancelled()).collect();
        assert_eq!(
            fired,
            [false, true, false],
            "the idlest with nothing waiting goes"
        );
    }

    #[tokio::test]
    async fn when_every_holder_has_a_request_waiting_the_idlest_goes() {
        let slots = Slots::new(2);
        let mut holders = tcp_holders(&slots, 2).await;
        for holder in holders.iter_mut() {
            send_unread(holder).await;
        }
        let (_, activity) = Tracked::new(tokio::io::duplex(64).1);
        let (_newcomer, evicted) = slots.admit(activity, None);
        assert!(evicted);
        let fired: Vec<bool> = holders.iter().map(|h| h.1.evicted.is_cancelled()).collect();
        assert_eq!(fired, [true, false]);
    }
}

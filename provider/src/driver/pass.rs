//! A pass: what every verb and every wake-up of the progress thread ends
//! with, under the device lock. The engine's packets go into the batch (a
//! lock of its own, sent after the device lock is released), through the
//! fault injector and the capture when there are; completion channels,
//! CM and asynchronous events are delivered; the progress thread is woken
//! if the engine now has an earlier timer than the one it sleeps towards.

use super::batch::{TxBatch, MAX_BATCH};
use super::device::ROCEV2_PORT;
use super::fault::Faults;
use super::shared::{earliest, CmEventSink, Core, Shared};
use crate::engine::{Engine, Nanos, TxPass};
use parking_lot::MutexGuard;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

impl Shared {
    /// Run deferred work, then a transmit pass and the notifications, under
    /// the device lock (`core`). Returns the batch of packets the pass made
    /// (locked), to be sent with [`send_batch`](Self::send_batch) once the
    /// device lock is released.
    #[must_use]
    pub(super) fn after_work(
        &self,
        core: &mut Core,
        ack_clocked: bool,
    ) -> Option<MutexGuard<'_, TxBatch>> {
        self.run_deferred(core);
        let mut now = self.now();
        let Core {
            engine,
            tx_buf,
            faults,
            tap,
            channels,
            event_sinks,
            stats,
            ..
        } = core;
        let mut txg: Option<MutexGuard<'_, TxBatch>> = None;
        // Without an injector, or with one that only drops packets (asked
        // once the engine has made each one; a dropped packet is never
        // committed to the batch), packets go the same way.
        match faults.as_mut().filter(|f| !f.drops_only()) {
            None => loop {
                // Large payloads leave straight from registered memory:
                // see `Shared::tx` for why they stay valid until sent.
                let pass = TxPass {
                    ack_clocked,
                    payload_by_ref: self.pacer.config().payload_by_ref,
                };
                let (t, p) = match txg.as_mut() {
                    // The engine writes straight into the batch.
                    Some(tx) => {
                        if tx.is_full() {
                            self.flush_and_receive(tx, engine, tap, stats, &mut now);
                        }
                        let Some(t) = engine.poll_transmit_pass(now, tx.slot(), pass) else {
                            break;
                        };
                        if faults.as_mut().is_some_and(|f| f.lose()) {
                            continue;
                        }
                        (
                            t,
                            tx.commit(t.len, t.dst, self.sock_of(t.src_port), t.payload),
                        )
                    }
                    // The first packet: the batch is taken only if there
                    // is one (a pass that sends nothing does not wait for
                    // the batch another thread is sending).
                    None => {
                        let Some(t) = engine.poll_transmit_pass(now, tx_buf, pass) else {
                            break;
                        };
                        if faults.as_mut().is_some_and(|f| f.lose()) {
                            continue;
                        }
                        let tx = txg.insert(self.tx.lock());
                        let sock = self.sock_of(t.src_port);
                        (t, tx.commit_copy(tx_buf, t.len, t.dst, sock, t.payload))
                    }
                };
                if let Some(tap) = tap.as_mut() {
                    match t.payload {
                        None => tap.write(self.addr, t.src_port, t.dst, ROCEV2_PORT, p),
                        Some(pl) => {
                            let (head, tail) = p.split_at(pl.at);
                            // SAFETY: the engine took the payload from its
                            // memory table in this call, and the table has
                            // not changed since (the engine is locked here).
                            let data = unsafe { pl.data.bytes() };
                            let whole = [head, data, tail].concat();
                            tap.write(self.addr, t.src_port, t.dst, ROCEV2_PORT, &whole);
                        }
                    }
                }
            },
            Some(f) => {
                // Each packet through the injector, one at a time; what it
                // lets through (now or later) joins the batch.
                let tx = txg.insert(self.tx.lock());
                f.release_due(now, &mut |p, dst, sport| {
                    self.emit_let_through(tap, tx, p, dst, sport)
                });
                let mut since_receive = 0;
                while let Some(t) = engine.poll_transmit(now, tx_buf) {
                    let p = &mut tx_buf[..t.len];
                    f.submit(now, p, t.dst, t.src_port, &mut |p, dst, sport| {
                        self.emit_let_through(tap, tx, p, dst, sport)
                    });
                    since_receive += 1;
                    if since_receive == MAX_BATCH {
                        since_receive = 0;
                        self.flush_and_receive(tx, engine, tap, stats, &mut now);
                    }
                }
            }
        }
        // Roxe peers beside rxe reached at their claim port receive through
        // a UDP socket, which does not drop a full window's burst as raw
        // sockets do: the wide window is safe towards them. Found by the
        // flushes of earlier batches.
        if let Some(tx) = txg.as_mut() {
            for (peer, direct) in tx.take_direct_changes() {
                engine.set_udp_peer(peer, direct);
            }
        }
        self.pacer.pass_done(|| engine.load());
        for (cq, ch) in channels.iter() {
            if engine.cq_mut(*cq).map(|c| c.take_events()).unwrap_or(0) > 0 {
                ch.notify(*cq);
            }
        }
        if engine.has_cm_events() {
            let sinks: Vec<Arc<CmEventSink>> = {
                let mut all = self.cm_sinks.lock();
                all.retain(|s| s.strong_count() > 0);
                all.iter().filter_map(Weak::upgrade).collect()
            };
            while let Some(ev) = engine.poll_cm_event(now) {
                for sink in &sinks {
                    sink(ev.clone());
                }
            }
        }
        if engine.has_events() {
            event_sinks.retain(|s| s.strong_count() > 0);
            for ev in engine.take_events() {
                for sink in event_sinks.iter().filter_map(Weak::upgrade) {
                    sink(ev);
                }
            }
        }
        let timers = engine.poll_timeout();
        let releases = faults.as_ref().and_then(Faults::next_release);
        self.pacer.timers_at(earliest(timers, releases));
        if let Some(d) = self.pacer.progress_deadline(timers, releases) {
            if d < self.sleeping_until.load(Ordering::Acquire) {
                self.sleeping_until.store(0, Ordering::Release);
                self.wake();
            }
        }
        txg
    }

    /// A batch's worth of the pass is out: send it, then receive. A pass
    /// may send a window (hundreds of µs); the ACKs and NAKs that came
    /// meanwhile are handled before the next batch, not after the pass, so
    /// a NAKed packet is resent now. `now` moves on if packets came.
    fn flush_and_receive(
        &self,
        tx: &mut TxBatch,
        engine: &mut Engine,
        tap: &mut Option<super::tap::Tap>,
        stats: &mut super::counters::DriverStats,
        now: &mut Nanos,
    ) {
        tx.flush(&self.send[..]);
        if self.receive_in_pass(engine, tap, stats) {
            *now = self.now();
        }
    }

    /// A packet the fault injector lets through: to the capture and the
    /// batch, on the socket of its source port.
    fn emit_let_through(
        &self,
        tap: &mut Option<super::tap::Tap>,
        tx: &mut TxBatch,
        p: &[u8],
        dst: IpAddr,
        sport: u16,
    ) {
        if let Some(t) = tap.as_mut() {
            t.write(self.addr, sport, dst, ROCEV2_PORT, p);
        }
        tx.push(&self.send[..], p, dst, self.sock_of(sport));
    }

    /// Which socket sends from source port `sport` (the engine took it
    /// from this pool, in this order).
    fn sock_of(&self, sport: u16) -> u8 {
        self.send_ports
            .iter()
            .position(|&q| q == sport)
            .unwrap_or(0) as u8
    }
}

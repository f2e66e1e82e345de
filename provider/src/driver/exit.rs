//! At process exit, the ACKs that QPs hold for an answer go out.
//!
//! A QP playing ping-pong holds the ACK of each message until its own
//! answer leaves, or a few turnarounds (`engine/ack_hold.rs`). A program
//! that exits right after its last message arrived, without destroying
//! the QP (destroying sends it: `Engine::destroy_qp`), would otherwise
//! take that ACK with it, and the peer's last send would end in
//! RETRY_EXC_ERR. So every open device is listed here, and a `.fini_array`
//! entry (run by `exit()` and after `main` returns) sends what the devices
//! hold. A process killed by a signal sends nothing, as before.

use super::shared::Shared;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The devices opened, with the process that opened each (a child of
/// fork(2) inherits the list, not the devices: their threads and ACKs
/// are the parent's).
static OPEN: Mutex<Vec<(u32, Weak<Shared>)>> = Mutex::new(Vec::new());

/// How long the exit hook waits for a device's lock (another thread may
/// hold it while the process exits).
const LOCK_WAIT: Duration = Duration::from_millis(20);

/// List a device just opened.
pub(super) fn register(shared: &Arc<Shared>) {
    // Referenced here so that the linker keeps the hook with this code.
    std::hint::black_box(&SEND_HELD_ACKS_AT_EXIT);
    let mut open = OPEN.lock();
    open.retain(|(_, w)| w.strong_count() > 0);
    open.push((std::process::id(), Arc::downgrade(shared)));
}

/// Send every ACK the open devices hold for an answer.
fn send_held_acks() {
    let Some(open) = OPEN.try_lock_for(LOCK_WAIT) else {
        return;
    };
    let pid = std::process::id();
    let ours = open.iter().filter(|(p, _)| *p == pid);
    for shared in ours.filter_map(|(_, w)| w.upgrade()) {
        let Some(mut core) = shared.core.try_lock_for(LOCK_WAIT) else {
            continue;
        };
        core.engine.release_held_acks();
        let batch = shared.after_work(&mut core, false);
        drop(core);
        shared.send_batch(batch);
    }
}

extern "C" fn send_held_acks_at_exit() {
    // Nothing unwinds out of the exit path.
    let _ = std::panic::catch_unwind(send_held_acks);
}

#[used]
#[link_section = ".fini_array"]
static SEND_HELD_ACKS_AT_EXIT: extern "C" fn() = send_held_acks_at_exit;

//! `haven admin cluster ...`: a replicated group's status, online membership changes and
//! leadership transfer, through any member's Raft port (changes are forwarded to the leader).

use clap::{Args, Subcommand};
use haven_raft::{AdminRequest, Member};
use std::net::SocketAddr;

#[derive(Args)]
pub struct AdminArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// A replicated group (`[ha] mode = "replicated"`).
    Cluster {
        /// Raft address of any member (`[[ha.members]] raft`).
        #[arg(long, default_value = "127.0.0.1:61700")]
        raft: String,
        #[command(subcommand)]
        op: Op,
    },
}

#[derive(Subcommand)]
enum Op {
    /// Print the member's view: role, term, log, voters, how far each member has caught up.
    Status,
    /// Add a member: it catches up as a learner (log or snapshot), then becomes a voter. Start
    /// it first, with the new member list in its config.
    Add {
        #[arg(long)]
        id: u64,
        /// Its Raft address.
        #[arg(long = "member-raft")]
        member_raft: SocketAddr,
        /// Its STOMP address.
        #[arg(long = "member-stomp")]
        member_stomp: SocketAddr,
    },
    /// Remove a member (the leader too: it steps down once the change is committed).
    Remove {
        #[arg(long)]
        id: u64,
    },
    /// Move leadership to another voter, e.g. before stopping the leader for maintenance.
    /// Clients fail over to the new leader; nothing is lost or duplicated.
    TransferLeader {
        /// The member to lead; by default the voter holding most of the log.
        #[arg(long)]
        to: Option<u64>,
    },
}

pub async fn run(args: AdminArgs) -> Result<(), String> {
    let What::Cluster { raft, op } = args.what;
    match op {
        Op::Status => {
            let s = haven_raft::client::status(&raft)
                .await
                .map_err(|e| format!("{raft}: {e}"))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&s).expect("a status serialises")
            );
            Ok(())
        }
        Op::Add {
            id,
            member_raft,
            member_stomp,
        } => {
            let member = Member::data(member_raft.to_string(), member_stomp.to_string());
            let done = haven_raft::client::change(&raft, AdminRequest::Add { id, member })
                .await
                .map_err(|e| e.to_string())?;
            println!("{done}");
            Ok(())
        }
        Op::TransferLeader { to } => {
            let done = haven_raft::client::change(&raft, AdminRequest::TransferLeader { to })
                .await
                .map_err(|e| e.to_string())?;
            println!("{done}");
            Ok(())
        }
        Op::Remove { id } => {
            let done = haven_raft::client::change(&raft, AdminRequest::Remove { id })
                .await
                .map_err(|e| e.to_string())?;
            println!("{done}");
            Ok(())
        }
    }
}

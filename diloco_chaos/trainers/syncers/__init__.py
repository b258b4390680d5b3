"""Each algorithm's synchronizer logic without sockets or threads: the `SyncerCore` protocol and its records
(`core`), Decoupled DiLoCo (`decoupled`, `decoupled_records`), the synchronous baselines ddp and diloco
(`synchronous`), elastic data parallel (`elastic_ddp`), and which shard owns which fragment (`shards`)."""

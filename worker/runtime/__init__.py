"""The training runtime: a Llama-style decoder and one public function per parallelism.

- ``apply_ddp`` / ``apply_fsdp`` (``data_parallel``): DDP for ZeRO-0, FSDP2 ``fully_shard`` for ZeRO-1/2/3
- ``apply_tensor_parallel`` (``tensor_parallel``): Megatron TP (+ sequence parallel) with DTensor
- ``apply_ulysses`` (``ulysses``): DeepSpeed-Ulysses all-to-all sequence parallelism
- ``build_schedule`` / ``cut_stage`` (``pipeline``): pipeline stages and GPipe / 1F1B / interleaved schedules
- ``apply_checkpointing`` (``checkpointing``): per-layer full or selective activation recompute
- ``apply_expert_parallel`` / ``expert_data_parallel`` (``expert_parallel``, layers in ``moe``, ``lsh``): MoE layers
  as the plan lays them out (expert parallelism, expert TP, expert-dp gradients, LSH-compressed all-to-alls)
- ``apply_plan`` / ``parallelize`` (``parallelize``): all of the above for a plan (on a given model / a built
  one); ``train.run_plan`` trains and measures
- ``train_checkpoint``: model / optimizer / RNG / position checkpoints with torch.distributed.checkpoint, resumed
  from the newest complete one; ``data.TokenFile``: a tokenized dataset file, one shard per data-parallel rank
"""

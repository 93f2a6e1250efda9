"""The training runtime: a Llama-style decoder and one public function per parallelism.

- ``ReplicatedParameters`` / ``apply_fsdp`` (``data_parallel``): per layer, gradient all-reduce for ZeRO-0/1 (ZeRO-1:
  optimizer state owned tensor by tensor), FSDP2 ``fully_shard`` for ZeRO-2/3
- ``tensor_parallel_block`` / ``tensor_parallel_ends`` (``tensor_parallel``): Megatron TP (+ sequence parallel) of a
  block / of the embedding and LM head, with DTensor
- ``apply_relayouts`` (``layouts``): activations re-laid out between neighbouring layers of different layouts
- ``apply_ulysses`` (``ulysses``): DeepSpeed-Ulysses all-to-all sequence parallelism
- ``apply_context_parallel`` (``ring_attention``): causal ring attention over a layer's cp group
- ``build_schedule`` / ``cut_stage`` (``pipeline``): pipeline stages and GPipe / 1F1B / interleaved schedules
- ``apply_checkpointing`` (``checkpointing``): per-layer full or selective activation recompute
- ``apply_expert_parallel`` / ``expert_data_parallel`` (``expert_parallel``, layers in ``moe``, ``lsh``): MoE layers
  as the plan lays them out (expert parallelism, expert TP, expert-dp gradients, LSH-compressed all-to-alls)
- ``apply_plan`` / ``parallelize`` (``parallelize``): all of the above for a plan (on a given model / a built
  one); ``train.run_plan`` trains and measures
- ``train_checkpoint``: model / optimizer / RNG / position checkpoints with torch.distributed.checkpoint, resumed
  from the newest complete one; ``data.TokenFile``: a tokenized dataset file, one shard per data-parallel rank
"""

"""Generated from the Kconfig tree by `kfit genoptions` (make genoptions): do not edit.
Every option of the tree as a typed field of `config.options` (lib/config/options.py)."""

from typing import Callable, Iterator, Literal

import kconfiglib

from .rules import VALIDATORS as VALIDATORS, validator as validator

def choice_name(choice: kconfiglib.Choice) -> str | None: ...
def fields(kconf: kconfiglib.Kconfig) -> Iterator[tuple[str, str, str, str]]: ...
def options_of(kconf: kconfiglib.Kconfig) -> Options: ...
def stub(kconf: kconfiglib.Kconfig) -> str: ...


class Options:
    """Every option of the tree, typed; read-only."""

    def __init__(self, values: dict[str, object]) -> None: ...
    def as_dict(self) -> dict[str, object]: ...

    model: Literal["lenet5", "resnet18", "resnet50", "gpt2", "llama", "custom"] | None
    """CONFIG_MODEL_*: The network to train. Image models (LeNet-5, ResNet) train on image classification data;
    GPT-2 and Llama train as causal language models on text."""
    custom_model_factory: str | None
    """CONFIG_CUSTOM_MODEL_FACTORY: Where to find the factory, as package.module:function. The module is imported
    with the current directory and the kfit checkout on sys.path. The factory takes no arguments and returns
    (model, make_batch, loss_fn): make_batch(batch_size, generator) -> (inputs, targets) on the CPU
    loss_fn(outputs, targets) -> scalar mean loss The example in scripts/custom_model_example.py wraps
    torch.nn.Transformer."""
    custom_train_samples: int | None
    """CONFIG_CUSTOM_TRAIN_SAMPLES: A custom model's batches come from its make_batch function, which is called
    with a generator seeded by (seed, sample indices); this many samples make one training epoch."""
    custom_eval_samples: int | None
    """CONFIG_CUSTOM_EVAL_SAMPLES: Samples drawn from make_batch (with seeds disjoint from the training ones) for
    each evaluation."""
    gpt2_preset: Literal["tiny", "30m", "51m", "124m", "355m", "774m", "1558m", "custom"] | None
    """CONFIG_GPT2_PRESET_*: Depth, heads and width of the transformer. The context length and the vocabulary come
    from the options below and from the dataset."""
    gpt2_layers: int | None
    """CONFIG_GPT2_LAYERS: Transformer blocks, each an attention and an MLP. Parameters, gradients, optimizer state
    and activations all grow with it."""
    gpt2_heads: int | None
    """CONFIG_GPT2_HEADS: Each head is GPT2_WIDTH / GPT2_HEADS wide (64 in every published GPT-2): the width must
    be a multiple of the heads."""
    gpt2_width: int | None
    """CONFIG_GPT2_WIDTH: The residual stream's width; the MLP is four times as wide."""
    gpt2_block_size: int | None
    """CONFIG_GPT2_BLOCK_SIZE: Number of tokens per training sequence. GPT-2 was trained at 1024. Activation memory
    grows linearly with it (attention runs through scaled_dot_product_attention, which avoids the quadratic
    matrix on GPUs with fused kernels)."""
    gpt2_dropout: float | None
    """CONFIG_GPT2_DROPOUT: Dropout on attention and residual paths, a number in [0, 1). 0.0 is usual when pre-
    training on plenty of data."""
    llama_preset: Literal["tiny", "20m", "60m", "125m", "350m", "1b", "3b", "8b", "70b", "405b", "custom"] | None
    """CONFIG_LLAMA_PRESET_*: Width, depth and heads of the decoder. The small presets' parameter counts are for a
    32,000-token vocabulary with tied embeddings; the Llama 3 presets (1B to 405B) are the published models'
    shapes, and their counts are for Llama 3's 128,256 tokens. The vocabulary comes from the dataset (256 bytes
    for the embedded text, the tokenizer's size for a corpus 'make data' wrote) unless VOCAB_SIZE sets it."""
    llama_dim: int | None
    """CONFIG_LLAMA_DIM: The residual stream's width. It must be a multiple of LLAMA_HEADS, and each head's width
    (LLAMA_DIM / LLAMA_HEADS) even, as rotary embeddings rotate pairs."""
    llama_layers: int | None
    """CONFIG_LLAMA_LAYERS: Transformer blocks, each an attention and a SwiGLU MLP. Parameters, gradients,
    optimizer state and activations all grow with it."""
    llama_heads: int | None
    """CONFIG_LLAMA_HEADS: Attention heads of the queries; each is LLAMA_DIM / LLAMA_HEADS wide (64 or 128 in
    published models)."""
    llama_kv_heads: int | None
    """CONFIG_LLAMA_KV_HEADS: Heads of keys and values, each shared by LLAMA_HEADS / LLAMA_KV_HEADS query heads: a
    divisor of LLAMA_HEADS. Equal to LLAMA_HEADS is ordinary multi-head attention; 1 is multi-query attention."""
    llama_ffn_dim: int | None
    """CONFIG_LLAMA_FFN_DIM: The width of the MLP's gate and up projections: about 8/3 of LLAMA_DIM times a
    multiplier in published models, rounded up to a multiple of 256 (Llama 3 8B: 14336 for width 4096)."""
    llama_rope_theta: float | None
    """CONFIG_LLAMA_ROPE_THETA: The base of the rotary embeddings' frequencies: 10,000 in Llama 1 and 2, 500,000 in
    Llama 3 (a longer context's positions stay apart)."""
    llama_block_size: int | None
    """CONFIG_LLAMA_BLOCK_SIZE: Tokens per training sequence. Rotary embeddings have no learned positions, so a
    model can later be run at other lengths, but it is trained at this one. Activation memory grows linearly
    with it."""
    llama_tie_embeddings: bool | None
    """CONFIG_LLAMA_TIE_EMBEDDINGS: Share one matrix between the token embedding and the output layer (as Llama 3.2
    1B and GPT-2 do). It saves vocabulary x width parameters, which matters most for small models; say n for
    separate matrices, as the larger Llama models use."""
    vocab_size: int | None
    """CONFIG_VOCAB_SIZE: The tokens the embedding and output layer hold. 0 takes the data's: 256 bytes for the
    embedded text, the tokenizer's size for a corpus 'make data' wrote. Set it (Llama 3: 128256, GPT-2: 50257)
    to plan a model at its real size before you have its corpus: make plan and make recommend need no data of
    that vocabulary. Training does: it refuses data whose token ids reach this size, so train on a corpus
    tokenized with the model's tokenizer (make data). Data with fewer tokens trains, the rows above its ids
    never a target."""
    pad_vocab: bool | None
    """CONFIG_PAD_VOCAB: Give the token embedding and the output layer a multiple of 64 rows (GPT-2's 50,257
    tokens: 50,304). The extra rows are never a target, so training learns to give them no probability, and
    sampling never picks them. A GPU runs a matrix product whose size is not a multiple of 16 bytes with slower
    kernels: on an H100, GPT-2 124M on 50,257 tokens took 81 ms a step at micro-batch 16 in bf16, 56 ms padded
    (compiled, where torch.compile pads them itself: 39.9 and 38.6 ms). A vocabulary of 256 bytes, or any
    multiple of 64, is unchanged. A run made before this option has the vocabulary's own rows: resume it, or
    start from its weights, with n."""
    resnet_image_size: int | None
    """CONFIG_RESNET_IMAGE_SIZE: Images are resized to this square size before entering the network. 64 or less
    uses the CIFAR-style stem (3x3 convolution, no max-pool); larger sizes use the ImageNet stem (7x7 stride-2
    convolution and max-pool). 224 is the ImageNet standard."""
    dropout: float | None
    """CONFIG_DROPOUT: Dropout before the classifier's last linear layer of LeNet-5, ResNet-18 and ResNet-50, as
    timm's drop_rate and torchvision's classifier heads place it: during training each input of that layer is
    zeroed with this probability (the rest scaled up to match); evaluation uses every input. A number in [0, 1);
    0 (the default) adds no layer at all. It regularises a model that overfits a small data set; search it with
    CONFIG_HPO_SPACE, like "DROPOUT=0..0.5". GPT-2 has its own CONFIG_GPT2_DROPOUT."""
    dataset: Literal["embedded", "dir"] | None
    """CONFIG_DATASET_*: Where training data comes from."""
    data_dir: str | None
    """CONFIG_DATA_DIR: Path to the dataset, absolute or relative to the directory make runs in. A missing, empty
    or corrupt directory stops training before it starts, with the path in the message."""
    dataset_format: Literal["mnist", "cifar10", "cifar100"] | None
    """CONFIG_DATASET_FORMAT_*: The layout of the image dataset in the dataset directory."""
    epochs: int | None
    """CONFIG_EPOCHS: Passes over the training set. Training also stops at MAX_STEPS or TIME_LIMIT, whichever comes
    first."""
    max_steps: int | None
    """CONFIG_MAX_STEPS: Stop after this many optimizer steps (one step = one effective batch, all its accumulated
    micro-batches). 0 trains for EPOCHS epochs."""
    time_limit: int | None
    """CONFIG_TIME_LIMIT: Stop at the first optimizer step boundary after this many seconds of training, then
    evaluate and write the final checkpoint."""
    optimizer: Literal["sgd", "adam", "adamw", "custom"] | None
    """CONFIG_OPTIMIZER_*: The optimizer. Weight decay applies to weight matrices and convolution kernels only,
    never to biases or normalisation parameters."""
    optimizer_name: str | None
    """CONFIG_OPTIMIZER_NAME: A class of torch.optim, such as Adagrad, RMSprop, NAdam, RAdam or Adamax; or
    module:function, a function of your own (its module on Python's path, e.g. beside the config) that takes the
    parameter groups and lr= and returns a torch.optim.Optimizer. LBFGS, which needs a closure every step, is
    not one kfit's loop can run."""
    sgd_momentum: float | None
    """CONFIG_SGD_MOMENTUM: Momentum factor, a number in [0, 1). Nesterov momentum is used when it is above 0."""
    learning_rate: float | None
    """CONFIG_LEARNING_RATE: A positive number such as 3e-4 or 0.1. It is the rate after warm-up; the schedule
    below decays it."""
    weight_decay: float | None
    """CONFIG_WEIGHT_DECAY: A number >= 0, such as 0.1 or 5e-4. It applies to the weight matrices and convolution
    kernels (every parameter of two or more dimensions); biases and normalisation scales are never decayed."""
    weight_decay_embeddings: bool | None
    """CONFIG_WEIGHT_DECAY_EMBEDDINGS: Whether weight decay applies to the embedding tables (nn.Embedding weights,
    and an output layer tied to one), as it does to the other matrices. Say n for the decay groups torchtitan
    and most large language model recipes use: no decay on embeddings, biases and norms. Changing it changes a
    run's trajectory, so a run resumes only with the setting it started with."""
    lr_schedule: Literal["cosine", "linear", "wsd", "constant", "custom"] | None
    """CONFIG_LR_SCHEDULE_*: How the learning rate changes over the run."""
    lr_min_ratio: float | None
    """CONFIG_LR_MIN_RATIO: Where the decay ends, a number in [0, 1]: 0.1 ends at a tenth of the peak, 0 at zero."""
    lr_decay_fraction: float | None
    """CONFIG_LR_DECAY_FRACTION: A number in (0, 1]: 0.2 decays over the last fifth of the steps after warm-up, the
    rest stays at the peak."""
    lr_schedule_function: str | None
    """CONFIG_LR_SCHEDULE_FUNCTION: package.module:function, its module on Python's path (e.g. beside the config):
    function(step) or function(step, total_steps), step counting optimizer steps from 0, returns the multiplier
    of the peak learning rate, a finite number >= 0. WARMUP_STEPS is not applied on top: the function does its
    own warm-up. The example in scripts/schedule_example.py is the original Transformer's inverse square root."""
    warmup_steps: int | None
    """CONFIG_WARMUP_STEPS: Optimizer steps over which the learning rate rises linearly from near zero to the peak."""
    grad_clip: float | None
    """CONFIG_GRAD_CLIP: Clip the global gradient norm to this value before each optimizer step. A number >= 0; 0
    disables clipping."""
    freeze: str | None
    """CONFIG_FREEZE: Parameters to leave untouched, as name patterns separated by spaces or commas, matched
    fnmatch-style against the model's parameter names: "encoder.*" freezes an encoder, "transformer.wte.*
    transformer.wpe.*" GPT-2's embeddings. A frozen parameter gets no gradient and no optimizer state, and the
    memory planner counts exactly that. The run's first lines say how many parameters are trainable. A pattern
    that matches no parameter is an error naming some real ones."""
    seed: int | None
    """CONFIG_SEED: Seeds initialisation and data order. The same seed, config and hardware give the same run."""
    log_interval: int | None
    """CONFIG_LOG_INTERVAL: How often training prints and records loss, learning rate and throughput."""
    eval_interval: int | None
    """CONFIG_EVAL_INTERVAL: How often to evaluate on the held-out split. The run always evaluates once at the end."""
    output_dir: str | None
    """CONFIG_OUTPUT_DIR: Each run writes a directory here (named RUN_NAME, or after the model and the start time)
    holding the final checkpoint, the .config and plan used, and metrics.jsonl."""
    run_name: str | None
    """CONFIG_RUN_NAME: Name of the run's directory under OUTPUT_DIR. Letters, digits, dot, dash and underscore
    only."""
    hyper_param: Literal["auto", "manual"] | None
    """CONFIG_HYPER_PARAM_*: AUTO sizes the micro-batch from the detected hardware and adds gradient accumulation
    so that the effective batch equals TARGET_EFFECTIVE_BATCH on any machine. MANUAL uses the values you give."""
    hyper_param_policy: Literal["planner", "tiers"] | None
    """CONFIG_HYPER_PARAM_POLICY_*: How AUTO finds the largest micro-batch the device can hold."""
    memory_profile: Literal["conservative", "balanced", "extreme", "custom"] | None
    """CONFIG_MEMORY_PROFILE_*: The memory budget is free device memory (RAM on a CPU) times this share; the
    planner keeps the predicted peak under it."""
    memory_profile_percent: int | None
    """CONFIG_MEMORY_PROFILE_PERCENT: The memory budget as a percentage of free device memory. The predicted peak
    can be up to about 2% under the real one, so a share above 97 leaves no margin."""
    target_effective_batch: int | None
    """CONFIG_TARGET_EFFECTIVE_BATCH: Samples (sequences for GPT-2) that contribute to each optimizer step, summed
    over micro-batches, accumulation steps and processes. The recommended values are 512 for LeNet-5 and
    ResNet-18, 256 for ResNet-50 and 512-1024 for GPT-2."""
    batch_size: int | None
    """CONFIG_BATCH_SIZE: Samples per forward/backward pass on each process."""
    gradient_accumulation: int | None
    """CONFIG_GRADIENT_ACCUMULATION: Micro-batches whose gradients are summed before each optimizer step."""
    eval_batch_size: int | None
    """CONFIG_EVAL_BATCH_SIZE: Samples per evaluation pass. Evaluation keeps no activations for a backward pass, so
    it can use a larger batch than training."""
    compile: Literal["auto", "manual"] | None
    """CONFIG_COMPILE_*: Whether the model runs through torch.compile."""
    compile_model: bool | None
    """CONFIG_COMPILE_MODEL: Run the model through torch.compile with the mode below, its loss in the same graph:
    fused with the model's output, a language model's cross-entropy never writes its logits' fp32 log-softmax
    (GPT-2 124M on 50,304 tokens, bf16, on an H100: 38.6 ms a step at micro-batch 16, 49.8 ms with the model
    compiled alone). The first steps are slow while it compiles."""
    compile_mode: Literal["default", "reduce_overhead", "max_autotune"] | None
    """CONFIG_COMPILE_MODE_*: The mode argument of torch.compile."""
    device: Literal["auto", "cuda", "cpu"] | None
    """CONFIG_DEVICE_*: Where training runs."""
    precision: Literal["auto", "bf16", "fp16", "fp32"] | None
    """CONFIG_PRECISION_*: The autocast dtype of forward and backward passes. Parameters and optimizer state stay
    in float32."""
    float8: Literal["off", "tensorwise", "rowwise"] | None
    """CONFIG_FLOAT8_*: The model's linear layers compute their matrix multiplies in float8 (torchao's float8
    training), with scales per tensor or per row; the rest of the step keeps the precision above. Needs float8
    tensor cores: an NVIDIA GPU of compute capability 8.9 or later (L4, L40S, H100, H200, B200). Elsewhere a
    float8 choice is refused in one line. The plan predicts the step with the GPU's float8 peak for those matrix
    multiplies and charges the casts of their operands at the GPU's memory bandwidth: where the casts cost more
    than float8 saves (a narrow model on an L4), it predicts the step slower."""
    tf32: Literal["auto", "on", "off"] | None
    """CONFIG_TF32_*: TensorFloat-32 runs float32 matmuls and convolutions on tensor cores with a 10-bit mantissa."""
    cudnn_benchmark: Literal["auto", "on", "off"] | None
    """CONFIG_CUDNN_BENCHMARK_*: cudnn.benchmark times convolution algorithms on first use of each input shape and
    keeps the fastest."""
    cpu_fallback: bool | None
    """CONFIG_CPU_FALLBACK: When CUDA fails to initialise or the GPU is unusable at start, train on the CPU with a
    warning instead of stopping. Select DEVICE_CUDA (or say n here) to refuse to run without the GPU."""
    gradient_checkpointing: bool | None
    """CONFIG_GRADIENT_CHECKPOINTING: Recompute activations in the backward pass instead of storing them: about a
    third more compute for much less activation memory (per residual stage for ResNet, per transformer block for
    GPT-2 and Llama). A custom model checkpoints through its own switch where it has one (a Hugging Face model's
    gradient checkpointing, or a grad_checkpointing attribute), else through PyTorch's activation checkpoint
    wrapper around its repeated blocks (see CHECKPOINT_MODULES). Without this the memory planner and the out-of-
    memory ladder may still switch it on where it lets more fit."""
    activation_checkpoint: Literal["full", "selective_op", "selective_layer"] | None
    """CONFIG_ACTIVATION_CHECKPOINT_*: When gradient checkpointing is on (set above, or switched on by the planner
    or the out-of-memory ladder), how much of each transformer block backward recomputes. The memory planner
    traces the choice, so the plan's micro-batch and peak follow it."""
    activation_checkpoint_every: int | None
    """CONFIG_ACTIVATION_CHECKPOINT_EVERY: k: blocks k, 2k, 3k, ... are checkpointed in full, the rest keep their
    activations. 2 halves full checkpointing's recompute."""
    checkpoint_modules: str | None
    """CONFIG_CHECKPOINT_MODULES: Which modules of a custom model gradient checkpointing recomputes, as class names
    separated by spaces or commas (e.g. "TransformerEncoderLayer"). Empty: a Hugging Face model that supports
    gradient checkpointing uses its own, any other model the layers that a ModuleList or Sequential holds two or
    more of (the outermost such class, not the attention inside a layer). Naming classes here overrides both. A
    name that matches no module of the model is an error listing the classes it has."""
    dataloader_workers_mode: Literal["auto", "manual"] | None
    """CONFIG_DATALOADER_WORKERS_*: Worker processes that prepare batches in parallel with training."""
    dataloader_workers: int | None
    """CONFIG_DATALOADER_WORKERS: Worker processes for torch.utils.data.DataLoader; 0 loads batches in the training
    process."""
    data_prefetch_factor: int | None
    """CONFIG_DATA_PREFETCH_FACTOR: How many batches each data loader worker keeps ready ahead of the training loop
    (DataLoader's prefetch_factor). 0 keeps PyTorch's default of 2. It applies only where batches are loaded by
    worker processes: with MANUAL 0 workers a non-zero value is an error, and where AUTO chooses no workers
    (training on a CPU) the plan says it is unused. Raise it when the input-wait warning appears during training
    although workers are busy, or when loading is bursty (large files, network storage); each prepared batch is
    held in memory. `make bench-data` measures batches per second across worker counts and depths."""
    cpu_threads: int | None
    """CONFIG_CPU_THREADS: Intra-op threads of each training process (torch.set_num_threads). 0 decides when
    training starts: on a CPU, the cores this process may use (affinity, container CPU quota) that other
    processes are not keeping busy, shared among the training processes, at least 1 (a thread more than the idle
    cores made steps 1.2 to 12 times slower on a shared 2-core CPU); on a GPU, the cores per process left after
    the data loader workers, at most 4. OMP_NUM_THREADS in the environment is obeyed under AUTO. A number above
    0 is used as given."""
    probe: Literal["auto", "always", "never"] | None
    """CONFIG_PROBE_*: A plan is a prediction. The probe runs a few real training steps at the planned micro-batch
    on the accelerator, bisects down if they run out of memory, and may try larger when the measured peak leaves
    clear room under the budget. The confirmed result is cached by a fingerprint of the hardware, model,
    precision, compile setting and library versions."""
    oom_recovery: bool | None
    """CONFIG_OOM_RECOVERY: On an out-of-memory error, free what the failed step held, halve the micro-batch,
    double the gradient accumulation (the effective batch is unchanged) and redo the same optimizer step: no
    sample is skipped or counted twice. Under several processes every rank takes the same decision."""
    oom_max_halvings: int | None
    """CONFIG_OOM_MAX_HALVINGS: After this many halvings, or at micro-batch 1, the out-of-memory ladder below takes
    its next allowed rung; with none left, training stops with advice."""
    oom_ladder_checkpointing: bool | None
    """CONFIG_OOM_LADDER_CHECKPOINTING: When halving the micro-batch can go no further and the step still runs out
    of memory, recompute activations in the backward pass (about a third more compute for much less activation
    memory) and redo the same step. The effective batch and the sample order stay the same. Printed once and
    recorded in metrics.jsonl with the predicted saving. Applies to models that have it (GPT-2, ResNet; not
    LeNet-5 or a custom model) when it is off."""
    oom_ladder_autocast: bool | None
    """CONFIG_OOM_LADDER_AUTOCAST: When the rungs before it did not help, a float32 run switches to bfloat16
    autocast (float16 with a gradient scaler on a GPU without bfloat16), halving most activation memory. Only
    with CONFIG_PRECISION_AUTO: a precision chosen by hand is never changed. Not on Apple MPS."""
    oom_ladder_offload: bool | None
    """CONFIG_OOM_LADDER_OFFLOAD: When the rungs before it did not help, a sharded run (FSDP, on a CUDA GPU)
    relaunches from its last checkpoint with FSDP2's CPUOffloadPolicy: parameters, gradients and optimizer state
    in host memory (much slower steps). Applies only to sharded runs without CONFIG_FSDP_CPU_OFFLOAD."""
    checkpoint_interval: Literal["auto", "steps"] | None
    """CONFIG_CHECKPOINT_INTERVAL_*: How often training writes a checkpoint it can resume from. Checkpoints are
    written atomically: the last good one is never damaged by a crash mid-write."""
    checkpoint_minutes: int | None
    """CONFIG_CHECKPOINT_MINUTES: The most wall time between automatic checkpoints (sooner where
    CHECKPOINT_LOST_WORK_PERCENT of the predicted run is shorter)."""
    checkpoint_lost_work_percent: int | None
    """CONFIG_CHECKPOINT_LOST_WORK_PERCENT: With a predicted run time (the plan's step-time prediction), the
    interval is at most this share of it, and at most CHECKPOINT_MINUTES: 2% of a 5-hour run is 6 minutes."""
    checkpoint_every_steps: int | None
    """CONFIG_CHECKPOINT_EVERY_STEPS: Write a checkpoint after every this many optimizer steps."""
    checkpoint_keep: int | None
    """CONFIG_CHECKPOINT_KEEP: Older periodic checkpoints beyond this many are deleted; keeping two means a corrupt
    latest one still leaves a good one to resume from."""
    checkpoint_best_keep: int | None
    """CONFIG_CHECKPOINT_BEST_KEEP: After every evaluation (each EVAL_INTERVAL steps, or each epoch, and the final
    one) the run keeps the checkpoints of its best this many evaluations as best-<step>.pt (best-<step>.dcp/ for
    a sharded run) beside the periodic ones, written atomically; the periodic rotation (CHECKPOINT_KEEP) never
    deletes them. Kept across a resume. 'make export RUN=<run>/best-<step>.pt' or
    'INIT_FROM=<run>/best-<step>.pt' use one."""
    checkpoint_best_metric: str | None
    """CONFIG_CHECKPOINT_BEST_METRIC: A metric of the evaluation: eval_loss (every model); accuracy, top5_accuracy
    (more than five classes) or macro_f1 (image models); perplexity (text models); or the name of a metric a
    custom model's factory returns. A torchmetrics Metric's higher_is_better says which way is better; otherwise
    names holding "loss", "error" or "perplexity" are better lower and names holding "accuracy" or "f1" better
    higher. A name the model's evaluation does not report is refused before training starts."""
    early_stop_patience: int | None
    """CONFIG_EARLY_STOP_PATIENCE: Stop training once this many evaluations in a row have not improved
    CHECKPOINT_BEST_METRIC on the best so far by more than EARLY_STOP_MIN_DELTA. The run then finishes normally:
    a final evaluation and checkpoint.pt, stop_reason "early_stop". Changing it does not change what a step
    computes, so a run may be resumed with another patience (it then stops by the new one)."""
    early_stop_min_delta: float | None
    """CONFIG_EARLY_STOP_MIN_DELTA: A number >= 0 in the metric's units: an evaluation improves only when it beats
    the best so far by more than this."""
    resume: bool | None
    """CONFIG_RESUME: 'make train' continues the latest run in OUTPUT_DIR whose .config matches, from its latest
    good checkpoint, and says so. 'make train RESUME=0' starts fresh for one run."""
    monitor: bool | None
    """CONFIG_MONITOR: A progress bar with ETA, loss, throughput and memory in a terminal, plain periodic lines
    otherwise; on NVIDIA GPUs also utilisation, temperature, power and throttle reasons through NVML, on AMD
    GPUs under ROCm utilisation, temperature and power through ROCm's amdsmi Python package, sampled in a
    background thread. Every logged line, evaluation and event goes to the run's metrics.jsonl with the latest
    readings."""
    monitor_interval_ms: int | None
    """CONFIG_MONITOR_INTERVAL_MS: How often the background thread samples device telemetry."""
    thermal: Literal["warn", "pause"] | None
    """CONFIG_THERMAL_*: What the monitor does when NVML reports a thermal throttle or the GPU's temperature (NVML,
    or amdsmi's edge sensor on AMD GPUs, the hotspot where a GPU has no edge sensor) reaches THERMAL_PAUSE_AT_C."""
    thermal_pause_at_c: int | None
    """CONFIG_THERMAL_PAUSE_AT_C: A reading at or above it (or a thermal throttle reason) pauses training."""
    thermal_resume_below_c: int | None
    """CONFIG_THERMAL_RESUME_BELOW_C: Training continues once the temperature is below this (and no thermal
    throttle is reported). Must be below THERMAL_PAUSE_AT_C."""
    battery_low_percent: int | None
    """CONFIG_BATTERY_LOW_PERCENT: Running on battery below this charge, training checkpoints every
    BATTERY_CHECKPOINT_MINUTES and, with BATTERY_STOP, stops cleanly. Above it, or on mains power, only a
    warning is printed."""
    battery_checkpoint_minutes: int | None
    """CONFIG_BATTERY_CHECKPOINT_MINUTES: The checkpoint interval while on battery below BATTERY_LOW_PERCENT
    (normally shorter than CHECKPOINT_MINUTES; a CHECKPOINT_INTERVAL_STEPS interval still applies beside it)."""
    battery_stop: bool | None
    """CONFIG_BATTERY_STOP: On battery below BATTERY_LOW_PERCENT, write a checkpoint, print the command that
    resumes, and exit with status 4; plug in and run it to continue."""
    track_tensorboard: bool | None
    """CONFIG_TRACK_TENSORBOARD: Also write what metrics.jsonl records to TensorBoard event files in <run
    dir>/tensorboard ('tensorboard --logdir runs'): every logged number as a scalar at its step, events as text,
    the config and the plan as hyperparameters. Needs 'pip install tensorboard'."""
    track_wandb: bool | None
    """CONFIG_TRACK_WANDB: Also log to a W&B run in project TRACKING_PROJECT, its files under the run directory;
    W&B's own variables apply (WANDB_MODE=offline, WANDB_API_KEY). Needs 'pip install wandb'."""
    track_mlflow: bool | None
    """CONFIG_TRACK_MLFLOW: Also log to an MLflow run in experiment TRACKING_PROJECT, at MLFLOW_TRACKING_URI when
    set, else the local store sqlite:///<OUTPUT_DIR>/mlflow.db. Needs 'pip install mlflow-skinny' (or mlflow)."""
    tracking_project: str | None
    """CONFIG_TRACKING_PROJECT: Where the runs are grouped; metrics.jsonl is always written too."""
    nproc_mode: Literal["auto", "manual"] | None
    """CONFIG_NPROC_*: How many data-parallel processes 'make train' launches on this machine (through torchrun,
    with DDP) when more than one. 'make train GPUS=N' overrides this for one run."""
    nproc: int | None
    """CONFIG_NPROC: Data-parallel processes on this machine. Multi-machine runs add NNODES, NODE_RANK and
    MASTER_ADDR on the make command line (README)."""
    parallel: Literal["auto", "ddp", "fsdp", "fsdp_grad_op", "hsdp"] | None
    """CONFIG_PARALLEL_*: How several training processes share the model. With one process there is nothing to
    share and every choice trains the same way."""
    fsdp_cpu_offload: bool | None
    """CONFIG_FSDP_CPU_OFFLOAD: FSDP2's CPUOffloadPolicy: sharded parameters and gradients live in host memory and
    the optimizer steps there; a GPU holds only the parameters being gathered, activations and scratch. Much
    slower (every step crosses PCIe); for models that do not fit even sharded. Ignored on a CPU."""
    tp: int | None
    """CONFIG_TP: How many processes split each transformer block's matrix multiplies between them (DTensor's
    parallelize_module: the attention's and the MLP's projections column- then row-wise, the norms sequence-
    parallel). The processes of one tensor-parallel group see the same samples; the data-parallel strategy above
    applies across the groups, so processes / TP replicas (or FSDP shards) share the batch and the effective
    batch stays as set. Keep a group within one machine: it communicates in every block. Needs a family with a
    tensor-parallel plan (Llama), a degree that divides the processes and the attention's key/value heads, and
    FSDP (not DDP) where there are several groups. With one process there is nothing to split: it trains whole
    blocks, and its checkpoints resume under TP (and TP's under it). On the command line: make train GPUS=4
    TP=2. 0 (AUTO) plans every degree that can split the model within a machine (1, 2, 4, ... up to its
    processes) and keeps the one with the highest predicted samples/s that fits memory, the smallest that fits
    where step time is unknown; 'make plan' shows the runner-ups and why each other degree lost."""
    pp: int | None
    """CONFIG_PP: How many processes the model's layers are cut between, in order (torch.distributed.pipelining):
    the first stage holds the token embedding, the last the final norm and the output layer, each its share of
    the blocks. A step's micro-batches (the gradient accumulation) flow through the stages as the schedule below
    orders them, so the effective batch stays exact. The stages of one pipeline see the same samples; the data-
    parallel strategy above (and TP) applies within each stage, as torchtitan composes them: processes = PP x TP
    x data-parallel groups. Put stages on different machines: a stage sends one micro-batch's activations to the
    next, the least traffic of any split. Needs a family with stages (Llama) whose output layer is not tied to
    its embedding, at least one block per stage, bf16 or fp32 (not fp16's gradient scaler), and FSDP (not DDP)
    where there are several groups. A checkpoint resumes under any other degree (its tensors keep the whole
    model's names). On the command line: make train GPUS=2 PP=2. 0 (AUTO) plans every degree that puts whole
    machines in each stage (1, 2, 4, ... up to the machines, NNODES=) and keeps the one with the highest
    predicted samples/s that fits memory, with TP=0 every pairing of the two; 'make plan' shows the runner-ups
    and why each other layout lost. On one machine it plans no pipeline."""
    pp_schedule: Literal["1f1b", "interleaved_1f1b", "gpipe"] | None
    """CONFIG_PP_SCHEDULE_*: The order in which the stages run the micro-batches' forwards and backwards
    (torch.distributed.pipelining's schedules, named as torchtitan names them). The idle time at the start and
    end of a step, the bubble, is (PP - 1) / (micro-batches + PP - 1) of it for GPipe and 1F1B, and that divided
    by the stages per process for the interleaved schedule; 'make plan' shows it."""
    cp: int | None
    """CONFIG_CP: How many processes split each sample's sequence between them
    (torch.distributed.tensor.experimental.context_parallel): each holds and computes 1/CP of the tokens in
    every layer, in chunks balanced for causal attention, and gathers the other processes' keys and values in
    each attention. For long contexts, whose activations no other split shrinks: 131072 tokens over CP=8 leave a
    process 16384 of them. The processes of one context-parallel group see the same samples, and FSDP shards the
    parameters over them and the data-parallel groups together, as torchtitan does: processes = PP x data-
    parallel groups x CP x TP. Needs a family whose attention is torch's scaled_dot_product_attention and whose
    positions are computed (Llama), a context that splits into 2 x CP equal chunks, FSDP (not DDP), and CUDA
    GPUs: torch intercepts only its CUDA attention kernels, so on a CPU it is planned for GPU= profiles and
    refused for training. On the command line: make plan GPU=h100 GPUS=8 CP=4. 0 (AUTO) plans every degree that
    leaves a process at least 2048 tokens within a machine (1, 2, 4, ... with TP: their product up to its
    processes) and keeps the one with the highest predicted samples/s that fits memory, with TP=0 or PP=0 every
    pairing; 'make plan' shows the runner-ups and why each other layout lost."""
    net_gbps: int | None
    """CONFIG_NET_GBPS: The bandwidth each GPU has to other machines, in GB/s in one direction, for the time of
    collectives when a run spans machines: a 400 Gb/s InfiniBand or RoCE port per GPU is 50, a 200 Gb/s one 25.
    0 plans with 25 GB/s, one 200 Gb/s port per GPU. The plan never counts more than the GPU's own link within a
    machine. On the command line: make plan GPU=h100 GPUS=8 NNODES=16 NET_GBPS=50."""
    lr_finder_min_lr: float | None
    """CONFIG_LR_FINDER_MIN_LR: The range test starts here and grows the learning rate exponentially each step."""
    lr_finder_max_lr: float | None
    """CONFIG_LR_FINDER_MAX_LR: The sweep ends here (or earlier, when the loss diverges)."""
    lr_finder_steps: int | None
    """CONFIG_LR_FINDER_STEPS: Optimizer steps from the smallest to the largest learning rate."""
    lr_finder_smoothing: float | None
    """CONFIG_LR_FINDER_SMOOTHING: Weight of each new loss in the moving average the suggestion reads, in (0, 1]; 1
    disables smoothing."""
    lr_finder_diverge: float | None
    """CONFIG_LR_FINDER_DIVERGE: The sweep stops when the smoothed loss exceeds this multiple of the best smoothed
    loss so far."""
    lr_scaling: Literal["auto", "linear", "sqrt", "none"] | None
    """CONFIG_LR_SCALING_*: The range test steps at one batch (the per-device micro-batch, or BATCH=), but training
    steps at the effective batch (micro-batch x accumulation x processes). make find-lr reports the rate at the
    batch it measured and the rate converted to the effective batch by this rule; APPLY=1 writes the converted
    one."""
    hpo_trials: int | None
    """CONFIG_HPO_TRIALS: Trials to run in this invocation ('make hpo TRIALS=n' overrides). Running 'make hpo'
    again continues the same study."""
    hpo_timeout: int | None
    """CONFIG_HPO_TIMEOUT: Stop starting new trials after this long."""
    hpo_study_name: str | None
    """CONFIG_HPO_STUDY_NAME: The Optuna study name in the storage; workers sharing a study through HPO_STORAGE use
    the same name."""
    hpo_space: str | None
    """CONFIG_HPO_SPACE: The config symbols each trial samples, separated by spaces: NAME=LOW..HIGH an int symbol
    (whole numbers) or a number symbol (e.g. dropout), uniform in [LOW, HIGH] NAME=LOW..HIGH:log the same, log-
    uniform (LOW > 0) NAME=A|B|C a choice by its members' suffixes (OPTIMIZER=ADAMW|SGD), or listed values
    (TARGET_EFFECTIVE_BATCH=64|128|256) For example: "LEARNING_RATE=1e-5..1e-1:log WARMUP_STEPS=0..500
    OPTIMIZER=ADAMW|SGD" Every value a trial draws is set as an override is, checked as strictly: 'make hpo'
    refuses, in one line, a name that is not an int, number or choice symbol of this config, or a range its
    values cannot take. Searching TARGET_EFFECTIVE_BATCH turns on HYPER_PARAM_AUTO, so the plan splits it into
    micro-batches. Empty: the learning rate and weight decay (HPO_LR_*, HPO_WD_*), the optimizer
    (HPO_OPTIMIZER_*) and the effective batch (HPO_BATCH_SIZES)."""
    hpo_objective: Literal["eval_loss", "accuracy", "macro_f1"] | None
    """CONFIG_HPO_OBJECTIVE_*: What each trial is scored by, at its last evaluation; the pruner compares trials by
    it after every epoch. A study keeps the objective it was created with."""
    hpo_folds: int | None
    """CONFIG_HPO_FOLDS: With k > 1, each trial trains k times, each time on k-1 folds of the training set and
    evaluating on the fold left out; its value is the mean over the folds. The evaluation split is not used. 1
    trains on the whole training set and evaluates on the evaluation split."""
    hpo_lr_min: float | None
    """CONFIG_HPO_LR_MIN: Lower end of the log-uniform learning-rate range."""
    hpo_lr_max: float | None
    """CONFIG_HPO_LR_MAX: Upper end of the log-uniform learning-rate range."""
    hpo_wd_min: float | None
    """CONFIG_HPO_WD_MIN: Lower end of the log-uniform weight-decay range."""
    hpo_wd_max: float | None
    """CONFIG_HPO_WD_MAX: Upper end of the log-uniform weight-decay range."""
    hpo_batch_sizes: str | None
    """CONFIG_HPO_BATCH_SIZES: Each trial samples one effective batch; the plan turns it into the micro-batch the
    device can hold plus gradient accumulation."""
    hpo_optimizer_sgd: bool | None
    """CONFIG_HPO_OPTIMIZER_SGD: Include SGD with momentum in the optimizer choice."""
    hpo_optimizer_adam: bool | None
    """CONFIG_HPO_OPTIMIZER_ADAM: Include Adam in the optimizer choice."""
    hpo_optimizer_adamw: bool | None
    """CONFIG_HPO_OPTIMIZER_ADAMW: Include AdamW in the optimizer choice."""
    hpo_min_resource: int | None
    """CONFIG_HPO_MIN_RESOURCE: Epochs every trial runs before Hyperband may prune it."""
    hpo_max_resource: int | None
    """CONFIG_HPO_MAX_RESOURCE: Epochs a trial that is never pruned trains for."""
    hpo_reduction_factor: int | None
    """CONFIG_HPO_REDUCTION_FACTOR: Each successive-halving rung keeps about 1/reduction_factor of the trials."""
    hpo_bootstrap_count: int | None
    """CONFIG_HPO_BOOTSTRAP_COUNT: Trials a rung needs before it starts pruning."""
    hpo_patience: int | None
    """CONFIG_HPO_PATIENCE: Also prune a trial whose evaluation loss has not improved for this many epochs
    (Optuna's PatientPruner around Hyperband)."""

"""The Kimi-K3 decode projections (local shapes at TP8) and the padded batches CUDA graphs capture."""

# (N, K) of each BF16 weight, with the layer it belongs to.
KIMI_K3_SHAPES = {
    (2112, 7168): "fused_qkv_a",
    (2304, 1536): "q_b",
    (7168, 1536): "o_proj",
    (1536, 7168): "mla_g / shared gate_up",
    (3072, 7168): "shared gate_up",
    (7168, 768): "shared down",
    (6288, 7168): "KDA in_proj",
    (3584, 7168): "latent expert down",
    (7168, 3584): "latent expert up",
    (8448, 7168): "dense gate_up",
    (7168, 4224): "dense down",
    (20480, 7168): "lm_head",
    (7168, 14336): "MTP eh_proj",
    (1536, 128): "tiny",
    (3072, 128): "tiny",
}

DECODE_BATCHES = (1, 2, 3, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# The issues' bars split the batches here: streaming (bandwidth-bound) up to it, compute-bound past it.
LAST_STREAMING_BATCH = 64

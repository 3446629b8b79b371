"""Tiny random judge models for the audio rewards' tests, built from configs (no download): a WavLM
x-vector speaker encoder and a CLAP model with their processors."""

import torch
from transformers import (
    ClapAudioConfig,
    ClapConfig,
    ClapFeatureExtractor,
    ClapModel,
    ClapProcessor,
    ClapTextConfig,
    RobertaTokenizerFast,
    Wav2Vec2FeatureExtractor,
    WavLMConfig,
    WavLMForXVector,
)
from tokenizers import Tokenizer, models, pre_tokenizers


def tiny_speaker_encoder():
    """(feature extractor, WavLMForXVector) at 16 kHz with 2 transformer layers of width 32."""
    config = WavLMConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(16, 16, 16), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4), num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=2, tdnn_dim=(16, 16, 32), tdnn_kernel=(5, 3, 1),
                         tdnn_dilation=(1, 2, 1), xvector_output_dim=24, feat_extract_norm="group", num_buckets=32,
                         max_bucket_distance=64)
    torch.manual_seed(0)
    model = WavLMForXVector(config).eval()
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                                         return_attention_mask=True)
    return extractor, model


def tiny_clap():
    """(ClapProcessor, ClapModel): a 2-layer text encoder over a character vocabulary, a tiny HTS-AT audio encoder at 48 kHz."""
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>", *"abcdefghijklmnopqrstuvwxyz "])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = RobertaTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                     unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")
    text = ClapTextConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=80, pad_token_id=1, projection_dim=16)
    audio = ClapAudioConfig(window_size=4, num_mel_bins=64, spec_size=64, patch_size=4, patch_stride=(4, 4),
                            num_classes=8, hidden_size=32, projection_dim=16, depths=[1, 1], num_attention_heads=[2, 2],
                            patch_embeds_hidden_size=16, enable_fusion=False)
    torch.manual_seed(0)
    model = ClapModel(ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=16)).eval()
    extractor = ClapFeatureExtractor(feature_size=64, sampling_rate=48000, hop_length=960, max_length_s=1, fft_window_size=1024,
                                     truncation="rand_trunc", padding="repeatpad")
    return ClapProcessor(feature_extractor=extractor, tokenizer=tokenizer), model


# The tiny DNSMOS stand-in: each window's (mean, mean square) through an affine map to 3 outputs
TINY_MOS_WEIGHT = [[1.5, -0.5, 2.0], [8.0, 12.0, 6.0]]  # [features 2, outputs 3]
TINY_MOS_BIAS = [3.0, 2.5, 2.8]


def tiny_mos_model(path) -> str:
    """Write an ONNX model shaped as DNSMOS P.835's (input `input_1` float [1, samples], output [1, 3])
    that maps a window's mean and mean square by TINY_MOS_WEIGHT / TINY_MOS_BIAS; return its path."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    nodes = [helper.make_node("Mul", ["input_1", "input_1"], ["square"]),
             helper.make_node("ReduceMean", ["input_1"], ["mean"], axes=[1], keepdims=1),
             helper.make_node("ReduceMean", ["square"], ["power"], axes=[1], keepdims=1),
             helper.make_node("Concat", ["mean", "power"], ["features"], axis=1),
             helper.make_node("Gemm", ["features", "weight", "bias"], ["scores"])]
    weights = [numpy_helper.from_array(np.asarray(TINY_MOS_WEIGHT, np.float32), "weight"),
               numpy_helper.from_array(np.asarray(TINY_MOS_BIAS, np.float32), "bias")]
    graph = helper.make_graph(nodes, "tiny_dnsmos", [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, [1, None])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)

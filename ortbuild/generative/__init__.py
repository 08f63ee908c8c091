"""Generative (decoder LLM) models: the artifact's runs through onnxruntime-genai and the fp32 reference."""

"""`localspec serve`: one engine behind the llama.cpp, OpenAI and Ollama dialects, plus a native event stream."""

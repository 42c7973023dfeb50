import json
import os

from openai import OpenAI

task = json.loads(os.environ["TETHER_TASK"])  # the task row, without its "grader" field
client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY, which tether sets per rollout
reply = client.chat.completions.create(
    model="policy",  # any name works: the gateway answers with the model being trained
    messages=[
        {"role": "system", "content": "Solve the problem. End with: The answer is N."},
        {"role": "user", "content": task["question"]},
    ],
    max_tokens=128,
)
answer = reply.choices[0].message.content or ""
print(" ".join(answer.split()))  # the LAST stdout line is the answer the grader reads

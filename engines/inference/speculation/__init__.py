"""Speculative decoding without a draft model: `drafts.DraftStore` proposes the next few tokens of a
running answer by suffix matching against its own context, its prompt group's other answers and
earlier answers to the same prompt. This package only proposes; the engine verifies every proposal
against the target model, so what is generated never depends on what is proposed here.
"""
